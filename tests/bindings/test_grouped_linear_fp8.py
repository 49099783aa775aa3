#!/usr/bin/python3
# Python binding test of an FP8 GroupedLinear: quantizers given as construct
# properties and through set_quantizers(), forward and backward against a
# float64 numpy reference over the quantized operands' values (delayed and
# blockwise scaling), the delayed scales' update, errors as GLib.Error.
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


def dequantized(quantizer, tensor, shape):
    """The values an FP8 product multiplies: the quantizer's FP8 values times their scales."""
    return download(quantizer.quantize(tensor).dequantize(Gmlp.DType.FLOAT32), shape)


def close(got, want, what, tol=2e-5):
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert np.all(np.isfinite(got)), what + ': not finite'
    assert err <= tol, '%s: relative error %.3g' % (what, err)


def quantizers(dev, recipe):
    return [Gmlp.Quantizer.new(dev, recipe, Gmlp.Fp8Format.HYBRID, role)
            for role in (Gmlp.QuantizerRole.INPUT, Gmlp.QuantizerRole.WEIGHT,
                         Gmlp.QuantizerRole.GRAD_OUTPUT)]


def test_grouped_linear_fp8():
    dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0) if os.environ.get('GMLP_DEVICE', 'cpu') == 'cpu' \
        else Gmlp.Device.get_default()
    E, K, N = 3, 32, 16
    rows = [9, 0, 21]
    M = sum(rows)
    starts = np.cumsum([0] + rows)
    q_in, q_w, q_dy = quantizers(dev, Gmlp.ScalingRecipe.DELAYED)

    layer = Gmlp.GroupedLinear(device=dev, n_groups=E, in_features=K, out_features=N,
                               dtype=Gmlp.DType.FLOAT32, input_quantizer=q_in,
                               weight_quantizer=q_w, grad_output_quantizer=q_dy)
    layer.init(None)
    assert layer.get_quantizer(Gmlp.QuantizerRole.WEIGHT) == q_w
    assert layer.props.grad_output_quantizer == q_dy

    w = rng.uniform(-0.5, 0.5, (E, N, K)).astype(np.float32)
    layer.set_weight_from_bytes(GLib.Bytes.new(w.tobytes()))
    w_t = upload(dev, w.reshape(E * N, K), [N] * E)

    for step in range(2):
        x = (rng.standard_normal((M, K)) * (2.0 - step)).astype(np.float32)
        dy = rng.standard_normal((M, N)).astype(np.float32)
        x_t, dy_t = upload(dev, x, rows), upload(dev, dy, rows)
        xq = dequantized(q_in, x_t, (M, K))
        wq = dequantized(q_w, w_t, (E, N, K))
        dyq = dequantized(q_dy, dy_t, (M, N))

        y_t, saved = layer.forward(x_t)
        dx_t = layer.backward(saved, dy_t)
        y_ref = np.concatenate([xq[starts[g]:starts[g + 1]] @ wq[g].T for g in range(E)])
        dx_ref = np.concatenate([dyq[starts[g]:starts[g + 1]] @ wq[g] for g in range(E)])
        dw_ref = np.stack([dyq[starts[g]:starts[g + 1]].T @ xq[starts[g]:starts[g + 1]] for g in range(E)])
        close(download(y_t, (M, N)), y_ref, 'step %d fprop' % step)
        close(download(dx_t, (M, K)), dx_ref, 'step %d dgrad' % step)
        close(download(layer.get_wgrad(), (E, N, K)), dw_ref, 'step %d wgrad' % step)
        # FP8 costs a few percent against the unquantized values.
        x64, w64 = x.astype(np.float64), w.astype(np.float64)
        y_exact = np.concatenate([x64[starts[g]:starts[g + 1]] @ w64[g].T for g in range(E)])
        close(download(y_t, (M, N)), y_exact, 'step %d fprop vs exact' % step, tol=0.06)
        layer.update_quantizers()
    assert q_in.save_state().lookup_value('scale', GLib.VariantType.new('ad'))[0] != 1.0

    # Recipes no product can combine: a GLib.Error, the layer unchanged.
    blockwise = quantizers(dev, Gmlp.ScalingRecipe.BLOCKWISE)
    try:
        layer.set_quantizers(blockwise[0], q_w, q_dy)
        raise AssertionError('mixed recipes accepted')
    except GLib.Error as e:
        assert e.matches(Gmlp.error_quark(), Gmlp.Error.UNSUPPORTED), e
    assert layer.props.input_quantizer == q_in

    # Blockwise throughout (FP8 products with 1 x 128 and 128 x 128 block
    # scales), against the blockwise-quantized operands' values, then FP8
    # off again.
    layer.set_quantizers(*blockwise)
    y_t, saved = layer.forward(upload(dev, x, rows))
    xq = dequantized(blockwise[0], upload(dev, x, rows), (M, K))
    wq = dequantized(blockwise[1], w_t, (E, N, K))
    y_ref = np.concatenate([xq[starts[g]:starts[g + 1]] @ wq[g].T for g in range(E)])
    close(download(y_t, (M, N)), y_ref, 'blockwise fprop', tol=5e-4)
    layer.set_quantizers(None, None, None)
    assert layer.props.input_quantizer is None
    # The backward of an FP8 forward, after FP8 was taken away, needs quantizers.
    try:
        layer.backward(saved, upload(dev, dy, rows))
        raise AssertionError('FP8 backward without quantizers accepted')
    except GLib.Error as e:
        assert e.matches(Gmlp.error_quark(), Gmlp.Error.INVALID_STATE), e
