#!/usr/bin/python3
# Python binding test: objects made the Python way, from keyword properties
# (g_object_new(), no Gio.Initable.init()), are complete; made bare or with
# properties that can't work, their methods raise GLib.Error, never crash.
# DLPack exports leak nothing, also when the consumer refuses them.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os

import numpy as np

import gi

gi.require_version('Gmlp', '1.0')
from gi.repository import GLib, Gmlp  # noqa: E402

rng = np.random.default_rng(int(os.environ.get('GMLP_TEST_SEED', np.random.SeedSequence().entropy % (1 << 32))))
DEV = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0)


def upload(array, rows):
    array = np.ascontiguousarray(array, dtype=np.float32)
    return Gmlp.GroupedTensor.new_from_bytes(DEV, Gmlp.DType.FLOAT32, rows, array.shape[-1],
                                             GLib.Bytes.new(array.tobytes()))


def download(tensor, shape):
    return np.frombuffer(tensor.to_bytes().get_data(), dtype=np.float32).reshape(shape).astype(np.float64)


def raises(fn, code):
    try:
        fn()
    except GLib.Error as e:
        assert e.matches(Gmlp.error_quark(), code), e
        return
    raise AssertionError('no GLib.Error')


def test_linear_from_properties():
    # The line that killed the interpreter.
    layer = Gmlp.GroupedLinear(device=DEV, n_groups=2, in_features=4, out_features=8)
    rows = [3, 5]
    x = rng.standard_normal((8, 4)).astype(np.float32)
    y, saved = layer.forward(upload(x, rows))
    w = download(layer.get_weight(), (2, 8, 4))
    x64 = x.astype(np.float64)
    want = np.concatenate([x64[:3] @ w[0].T, x64[3:] @ w[1].T])
    got = download(y, (8, 8))
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < 1e-5, err
    dx = layer.backward(saved, upload(np.ones((8, 8), np.float32), rows))
    assert dx.get_total_rows() == 8


def test_mlp_from_properties():
    mlp = Gmlp.GroupedMLP(device=DEV, n_groups=3, hidden=8, ffn_hidden=16,
                          activation=Gmlp.Activation.SWIGLU)
    y, saved = mlp.forward(upload(rng.standard_normal((6, 8)), [2, 0, 4]))
    assert y.get_total_rows() == 6 and np.all(np.isfinite(download(y, (6, 8))))
    assert mlp.get_fc1().get_out_features() == 32


def test_tensor_from_properties():
    t = Gmlp.GroupedTensor(rows=GLib.Variant('ax', [2, 3]), cols=4, dtype=Gmlp.DType.FLOAT32)
    t.fill_zero()
    assert t.get_n_groups() == 2 and t.get_total_rows() == 5
    assert np.all(download(t, (5, 4)) == 0)
    assert list(t.props.rows) == [2, 3]


def test_failed_constructions_raise():
    bad = Gmlp.GroupedLinear(device=DEV, n_groups=0)
    raises(lambda: bad.forward(upload(np.zeros((1, 1)), [1])), Gmlp.Error.INVALID_ARGUMENT)
    raises(lambda: bad.init(None), Gmlp.Error.INVALID_ARGUMENT)
    assert bad.get_weight() is None
    raises(lambda: Gmlp.GroupedMLP(hidden=-1).forward(upload(np.zeros((1, 1)), [1])),
           Gmlp.Error.INVALID_ARGUMENT)
    raises(lambda: Gmlp.GroupedTensor().to_bytes(), Gmlp.Error.INVALID_STATE)
    raises(lambda: Gmlp.GroupedTensor(rows=GLib.Variant('ax', [2 ** 31]), cols=2 ** 31).fill_zero(),
           Gmlp.Error.INVALID_ARGUMENT)
    raises(lambda: Gmlp.Graph().replay(), Gmlp.Error.INVALID_STATE)
    raises(lambda: Gmlp.Device(kind=Gmlp.DeviceKind.CUDA, ordinal=4096).synchronize(),
           Gmlp.Error.NO_DEVICE)
    layer = Gmlp.GroupedLinear(device=DEV, n_groups=1, in_features=2, out_features=2)
    raises(lambda: layer.backward(Gmlp.SavedActivations(), upload(np.zeros((1, 2)), [1])),
           Gmlp.Error.INVALID_ARGUMENT)
    assert Gmlp.Event().is_complete()
    assert Gmlp.Device() is Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0)


def test_dlpack_leaks_nothing():
    t = Gmlp.GroupedTensor.new(DEV, Gmlp.DType.BFLOAT16, [4], 128)
    t.fill_zero()
    assert t.__grefcount__ == 1
    # numpy has no bfloat16: its own error, and the export is released
    # (SystemError, and a tensor kept forever, before).
    try:
        np.from_dlpack(t)
        raise AssertionError('numpy took a bfloat16 tensor')
    except (RuntimeError, BufferError, TypeError) as e:
        assert not isinstance(e, SystemError), e
    assert t.__grefcount__ == 1, t.__grefcount__
    capsule = t.to_dlpack()
    assert t.__grefcount__ == 2
    del capsule
    assert t.__grefcount__ == 1, t.__grefcount__

    f = Gmlp.GroupedTensor.new(DEV, Gmlp.DType.FLOAT32, [3, 5], 64)
    f.fill_random(3, 1.0)
    a = np.from_dlpack(f)
    assert a.shape == (8, 64) and f.__grefcount__ == 2
    assert np.array_equal(a, download(f, (8, 64)))
    del a
    assert f.__grefcount__ == 1, f.__grefcount__
    raises(lambda: np.from_dlpack(Gmlp.GroupedTensor.new(DEV, Gmlp.DType.FLOAT32, [4, 3], 3)),
           Gmlp.Error.UNSUPPORTED)
