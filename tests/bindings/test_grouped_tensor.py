#!/usr/bin/python3
# Python binding test: a grouped tensor built from bytes and read back,
# conversion checked against a float64 reference, errors as GLib.Error.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import math
import os
import random
import struct

import gi

gi.require_version('Gmlp', '1.0')
from gi.repository import GLib, Gmlp  # noqa: E402

random.seed(int(os.environ['GMLP_TEST_SEED']))


def bf16_round(x):
    """float64 model of round-to-nearest-even to bfloat16."""
    if x == 0 or math.isinf(x) or math.isnan(x):
        return x
    m, e = math.frexp(x)
    quantum = math.ldexp(1.0, max(e - 1, -126) - 7)
    return round(x / quantum) * quantum   # Python's round() is ties-to-even


def test_round_trip():
    dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0)
    rows = [random.randint(0, 9) for _ in range(5)]
    cols = random.randint(1, 40)
    n = sum(rows) * cols
    values = [random.gauss(0.0, 3.0) for _ in range(n)]
    data = struct.pack('<%df' % n, *values)
    t = Gmlp.GroupedTensor.new_from_bytes(dev, Gmlp.DType.FLOAT32, rows, cols,
                                          GLib.Bytes.new(data))
    assert t.get_n_groups() == 5 and len(t) == 5
    assert t.props.cols == cols and t.get_total_rows() == sum(rows)
    assert t.shape == (sum(rows), cols) and t.sizes == tuple(rows)
    assert t.to_bytes().get_data() == data
    for g in range(5):
        assert t.get_member_offset(g) % Gmlp.MEMBER_ALIGNMENT == 0
    # A member view shares the storage.
    g = max(range(5), key=lambda i: rows[i])
    view = t[g]
    start = sum(rows[:g]) * cols * 4
    assert view.is_view() and view.to_bytes().get_data() == data[start:start + rows[g] * cols * 4]
    view.fill_zero()
    assert t.to_bytes().get_data()[start:start + rows[g] * cols * 4] == bytes(rows[g] * cols * 4)


def test_convert():
    dev = Gmlp.Device.get_default()
    rows = [3, 0, 7]
    cols = 9
    n = sum(rows) * cols
    values = [random.uniform(-100, 100) for _ in range(n)]
    packed = struct.pack('<%df' % n, *values)
    values = struct.unpack('<%df' % n, packed)          # as float32
    t = Gmlp.GroupedTensor.new_from_bytes(dev, Gmlp.DType.FLOAT32, rows, cols,
                                          GLib.Bytes.new(packed))
    b = t.convert(Gmlp.DType.BFLOAT16)
    assert b.get_dtype() == Gmlp.DType.BFLOAT16
    raw = b.to_bytes().get_data()
    got = [struct.unpack('<f', struct.pack('<I', h << 16))[0]
           for h in struct.unpack('<%dH' % n, raw)]
    for i, (g, v) in enumerate(zip(got, values)):
        assert g == bf16_round(v), (i, g, v)


def test_errors():
    dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0)
    try:
        Gmlp.GroupedTensor.new_from_bytes(dev, Gmlp.DType.FLOAT32, [2, 2], 4,
                                          GLib.Bytes.new(bytes(12)))
        raise AssertionError('no error for a short buffer')
    except GLib.Error as e:
        assert e.matches(Gmlp.error_quark(), Gmlp.Error.INVALID_ARGUMENT), e
    t = Gmlp.GroupedTensor.new_uniform(dev, Gmlp.DType.FLOAT32, 2, 3, 4)
    try:
        t.get_member(2)
        raise AssertionError('no error for an index out of range')
    except GLib.Error as e:
        assert e.matches(Gmlp.error_quark(), Gmlp.Error.INVALID_ARGUMENT), e
    try:
        t[5]
        raise AssertionError('no IndexError')
    except IndexError:
        pass
    if Gmlp.Device.get_count(Gmlp.DeviceKind.CUDA) == 0:
        try:
            Gmlp.Device.new(Gmlp.DeviceKind.CUDA, 0)
            raise AssertionError('no error for a missing GPU')
        except GLib.Error as e:
            assert e.matches(Gmlp.error_quark(), Gmlp.Error.NO_DEVICE), e


def test_device_sizes():
    dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0)
    sizes_data = struct.pack('<3q', 4, 0, 2)
    sizes = Gmlp.GroupedTensor.new_from_bytes(dev, Gmlp.DType.INT64, [3], 1,
                                              GLib.Bytes.new(sizes_data))
    t = Gmlp.GroupedTensor.new_with_device_sizes(dev, Gmlp.DType.FLOAT16, sizes, 10, 8)
    assert not t.has_host_sizes() and t.get_rows(0) == -1
    assert t.read_sizes() == [4, 0, 2]
    t.fill_random(42, 1.0)
    assert len(t.to_bytes().get_data()) == 6 * 8 * 2


def test_dlpack():
    try:
        import numpy
    except ImportError:
        return
    import gc
    dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0)
    rows = [3, 0, 5]
    values = [random.uniform(-1, 1) for _ in range(8 * 64)]
    data = struct.pack('<%df' % len(values), *values)
    t = Gmlp.GroupedTensor.new_from_bytes(dev, Gmlp.DType.FLOAT32, rows, 64, GLib.Bytes.new(data))
    assert t.__dlpack_device__() == (1, 0)
    a = numpy.from_dlpack(t)
    assert a.shape == (8, 64) and a.dtype == numpy.float32
    assert a.tobytes() == data
    # Zero copy: a write through the tensor shows in the array, which keeps
    # the storage alive after the tensor object goes.
    t[2].fill_zero()
    assert not a[3:].any() and a[:3].tobytes() == data[:3 * 64 * 4]
    del t
    gc.collect()
    assert a[:3].tobytes() == data[:3 * 64 * 4]
    # Padded members are not one array: a clear error, views export.
    p = Gmlp.GroupedTensor.new_uniform(dev, Gmlp.DType.FLOAT32, 2, 3, 5)
    try:
        numpy.from_dlpack(p)
        raise AssertionError('padded members exported')
    except GLib.Error as e:
        assert e.matches(Gmlp.error_quark(), Gmlp.Error.UNSUPPORTED), e
    p.fill_random(3, 1.0)
    assert numpy.from_dlpack(p[1]).shape == (3, 5)
    # An unconsumed capsule frees its export.
    cap = p[1].__dlpack__()
    del cap
