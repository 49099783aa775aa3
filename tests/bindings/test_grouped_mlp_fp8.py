#!/usr/bin/python3
# Python binding test of an FP8 GroupedMLP: the fp8-recipe construct
# property and set_fp8_recipe(), forward and backward against a float64
# numpy reference of the exact MLP (FP8 costs a few percent), delayed
# scaling over steps with update_quantizers(), errors as GLib.Error, the
# weight cache (cache-fp8-weights, invalidate_fp8_weights()).
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os

import numpy as np

import gi

gi.require_version('Gmlp', '1.0')
from gi.repository import GLib, Gmlp  # noqa: E402

rng = np.random.default_rng(int(os.environ.get('GMLP_TEST_SEED', np.random.SeedSequence().entropy % (1 << 32))))


def upload(dev, array, rows):
    array = np.ascontiguousarray(array, dtype=np.float32)
    return Gmlp.GroupedTensor.new_from_bytes(dev, Gmlp.DType.FLOAT32, rows, array.shape[-1],
                                             GLib.Bytes.new(array.tobytes()))


def download(tensor, shape):
    return np.frombuffer(tensor.to_bytes().get_data(), dtype=np.float32).reshape(shape).astype(np.float64)


def close(got, want, what, tol):
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert np.all(np.isfinite(got)), what + ': not finite'
    assert err <= tol, '%s: relative error %.3g > %.3g' % (what, err, tol)
    return err


def silu(v):
    return v / (1.0 + np.exp(-v))


def dsilu(v):
    s = 1.0 / (1.0 + np.exp(-v))
    return s * (1.0 + v * (1.0 - s))


def test_grouped_mlp_fp8():
    dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0) if os.environ.get('GMLP_DEVICE', 'cpu') == 'cpu' \
        else Gmlp.Device.get_default()
    E, H, F = 3, 32, 48
    rows = [19, 0, 40]
    M = sum(rows)
    starts = np.cumsum([0] + rows)

    mlp = Gmlp.GroupedMLP(device=dev, n_groups=E, hidden=H, ffn_hidden=F,
                          activation=Gmlp.Activation.SWIGLU, dtype=Gmlp.DType.FLOAT32,
                          fp8_recipe=Gmlp.ScalingRecipe.DELAYED)
    mlp.init(None)
    assert mlp.props.fp8_recipe == Gmlp.ScalingRecipe.DELAYED
    assert mlp.props.fp8_format == Gmlp.Fp8Format.HYBRID
    fc1, fc2 = mlp.get_fc1(), mlp.get_fc2()
    q_in = fc2.get_quantizer(Gmlp.QuantizerRole.INPUT)
    assert q_in.get_recipe() == Gmlp.ScalingRecipe.DELAYED
    assert fc2.get_quantizer(Gmlp.QuantizerRole.GRAD_OUTPUT).get_dtype() == Gmlp.DType.FLOAT8_E5M2

    w1 = rng.uniform(-0.3, 0.3, (E, 2 * F, H)).astype(np.float32)
    w2 = rng.uniform(-0.3, 0.3, (E, H, F)).astype(np.float32)
    fc1.set_weight_from_bytes(GLib.Bytes.new(w1.tobytes()))
    fc2.set_weight_from_bytes(GLib.Bytes.new(w2.tobytes()))
    w1, w2 = w1.astype(np.float64), w2.astype(np.float64)

    for step, amplitude in enumerate((2.0, 1.0, 0.5)):
        x = (rng.standard_normal((M, H)) * amplitude).astype(np.float32)
        dy = rng.standard_normal((M, H)).astype(np.float32)
        y_t, saved = mlp.forward(upload(dev, x, rows))
        dx_t = mlp.backward(saved, upload(dev, dy, rows))

        x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
        y_ref, dx_ref = np.zeros((M, H)), np.zeros((M, H))
        dw1_ref, dw2_ref = np.zeros_like(w1), np.zeros_like(w2)
        for g in range(E):
            xs, dys = x64[starts[g]:starts[g + 1]], dy64[starts[g]:starts[g + 1]]
            h = xs @ w1[g].T
            a, b = h[:, :F], h[:, F:]
            act = silu(a) * b
            y_ref[starts[g]:starts[g + 1]] = act @ w2[g].T
            da = dys @ w2[g]
            dh = np.concatenate([da * b * dsilu(a), da * silu(a)], axis=1)
            dx_ref[starts[g]:starts[g + 1]] = dh @ w1[g]
            dw2_ref[g] = dys.T @ act
            dw1_ref[g] = dh.T @ xs
        # A few percent per FP8 product (E4M3 forward, E5M2 gradients);
        # the scales of a step come from the amaxes of those before.
        errs = (close(download(y_t, (M, H)), y_ref, 'step %d y' % step, 0.10),
                close(download(dx_t, (M, H)), dx_ref, 'step %d dx' % step, 0.15),
                close(download(fc1.get_wgrad(), (E, 2 * F, H)), dw1_ref, 'step %d fc1 wgrad' % step, 0.15),
                close(download(fc2.get_wgrad(), (E, H, F)), dw2_ref, 'step %d fc2 wgrad' % step, 0.13))
        print('# step %d: y %.4f dx %.4f fc1 dW %.4f fc2 dW %.4f' % ((step,) + errs))
        mlp.update_quantizers()
    scale = q_in.save_state().lookup_value('scale', GLib.VariantType.new('ad'))
    assert scale[0] != 1.0 and scale[2] != 1.0

    # A format no FP8 product takes: a GLib.Error, the MLP unchanged.
    try:
        mlp.set_fp8_recipe(Gmlp.ScalingRecipe.CURRENT, Gmlp.Fp8Format.E5M2)
        raise AssertionError('E5M2 x E5M2 accepted')
    except GLib.Error as e:
        assert e.matches(Gmlp.error_quark(), Gmlp.Error.UNSUPPORTED), e
    assert mlp.props.fp8_recipe == Gmlp.ScalingRecipe.DELAYED
    assert fc2.get_quantizer(Gmlp.QuantizerRole.INPUT) == q_in

    # Another recipe, then FP8 off.
    mlp.set_fp8_recipe(Gmlp.ScalingRecipe.MXFP8, Gmlp.Fp8Format.HYBRID)
    assert fc1.get_quantizer(Gmlp.QuantizerRole.WEIGHT).get_recipe() == Gmlp.ScalingRecipe.MXFP8
    y_t, saved = mlp.forward(upload(dev, x, rows))
    mlp.backward(saved, upload(dev, dy, rows))

    # The weight cache of both layers: stale after an in-place change of
    # the weights (as an optimizer step makes) until invalidated.
    notified = []
    mlp.connect('notify::cache-fp8-weights', lambda *args: notified.append(1))
    assert mlp.props.cache_fp8_weights is False
    mlp.props.cache_fp8_weights = True
    assert mlp.get_cache_fp8_weights() and fc1.props.cache_fp8_weights and fc2.props.cache_fp8_weights
    x_t = upload(dev, x, rows)
    y0 = mlp.forward(x_t)[0].to_bytes().get_data()
    assert mlp.forward(x_t)[0].to_bytes().get_data() == y0
    fc2.get_weight().fill_random(int(rng.integers(1 << 32)), 0.3)
    assert mlp.forward(x_t)[0].to_bytes().get_data() == y0
    mlp.invalidate_fp8_weights()
    assert mlp.forward(x_t)[0].to_bytes().get_data() != y0
    mlp.set_cache_fp8_weights(False)
    assert not mlp.props.cache_fp8_weights and not fc1.props.cache_fp8_weights
    assert len(notified) == 2

    mlp.set_fp8_recipe(Gmlp.ScalingRecipe.NONE, Gmlp.Fp8Format.HYBRID)
    assert fc1.get_quantizer(Gmlp.QuantizerRole.INPUT) is None
    assert mlp.props.fp8_recipe == Gmlp.ScalingRecipe.NONE
