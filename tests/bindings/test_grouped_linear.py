#!/usr/bin/python3
# Python binding test: two SGD steps of one GroupedLinear through PyGObject,
# every result compared with a float64 numpy reference; the loss must fall.
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


def close(got, want, what, tol=1e-5):
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert np.all(np.isfinite(got)), what + ': not finite'
    assert err <= tol, '%s: relative error %.3g' % (what, err)


def training():
    dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0) if os.environ.get('GMLP_DEVICE', 'cpu') == 'cpu' \
        else Gmlp.Device.get_default()
    E, K, N = 3, 16, 8
    rows = [7, 0, 12]
    M = sum(rows)
    layer = Gmlp.GroupedLinear.new_full(dev, E, K, N, Gmlp.DType.FLOAT32,
                                        Gmlp.LinearFlags.BIAS | Gmlp.LinearFlags.SINGLE_GROUPED_WEIGHT)
    assert layer.props.bias and layer.props.n_groups == E

    w = (rng.standard_normal((E, N, K)) * 0.3).astype(np.float32)
    b = (rng.standard_normal((E, N)) * 0.1).astype(np.float32)
    x = rng.standard_normal((M, K)).astype(np.float32)
    target = rng.standard_normal((M, N)).astype(np.float32)
    layer.set_weight_from_bytes(GLib.Bytes.new(w.tobytes()))
    layer.set_bias_from_bytes(GLib.Bytes.new(b.tobytes()))
    x_t = upload(dev, x, rows)
    lr = 0.01
    starts = np.cumsum([0] + rows)
    losses = []
    ready = []
    layer.connect('wgrad-ready', lambda _layer, event: ready.append(event.synchronize()))

    for step in range(2):
        y_t, saved = layer.forward(x_t)
        y = download(y_t, (M, N))
        w64, b64, x64 = w.astype(np.float64), b.astype(np.float64), x.astype(np.float64)
        y_ref = np.concatenate([x64[starts[g]:starts[g + 1]] @ w64[g].T + b64[g] for g in range(E)])
        close(y, y_ref, 'step %d fprop' % step)

        loss = 0.5 * float(np.sum((y_ref - target) ** 2))
        losses.append(loss)
        dy = (y - target).astype(np.float32)
        dx = download(layer.backward(saved, upload(dev, dy, rows)), (M, K))
        assert saved.is_consumed()
        dy64 = dy.astype(np.float64)
        dx_ref = np.concatenate([dy64[starts[g]:starts[g + 1]] @ w64[g] for g in range(E)])
        dw_ref = np.stack([dy64[starts[g]:starts[g + 1]].T @ x64[starts[g]:starts[g + 1]] for g in range(E)])
        db_ref = np.stack([dy64[starts[g]:starts[g + 1]].sum(axis=0) for g in range(E)])
        close(dx, dx_ref, 'step %d dgrad' % step)
        dw = download(layer.get_wgrad(), (E, N, K))
        db = download(layer.get_bgrad(), (E, N))
        close(dw, dw_ref, 'step %d wgrad' % step)
        close(db, db_ref, 'step %d dbias' % step)
        assert np.all(dw[1] == 0) and np.all(db[1] == 0), 'empty group has a gradient'

        # SGD step, written back through the API.
        w = (w - lr * dw).astype(np.float32)
        b = (b - lr * db).astype(np.float32)
        layer.set_weight_from_bytes(GLib.Bytes.new(w.tobytes()))
        layer.set_bias_from_bytes(GLib.Bytes.new(b.tobytes()))

    assert ready == [True, True], ready
    y_final = download(layer.forward(x_t)[0], (M, N))
    losses.append(0.5 * float(np.sum((y_final - target) ** 2)))
    assert losses[0] > losses[1] > losses[2], losses

    try:
        layer.backward(saved, upload(dev, dy, rows))
        raise AssertionError('no error for saved activations used twice')
    except GLib.Error as e:
        assert e.matches(Gmlp.error_quark(), Gmlp.Error.INVALID_STATE), e
    return losses


def test_grouped_linear_training():
    losses = training()
    print('loss %s' % ' > '.join('%.4f' % l for l in losses))
