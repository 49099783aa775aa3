#!/usr/bin/python3
# Python binding test: numpy and torch interop both ways. DLPack import
# (zero-copy where the layout allows, proven by writes through each side),
# __array__, __dlpack__, the array-like properties, the typed-array
# constructors and readers, and the errors; values against float64
# references from fresh random inputs.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import gc
import os
import pydoc
import sys

import numpy as np
import pytest

import gi

gi.require_version('Gmlp', '1.0')
from gi.repository import GLib, Gmlp  # noqa: E402

rng = np.random.default_rng(int(os.environ['GMLP_TEST_SEED']))
DEV = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0)
# Row widths whose bytes are a multiple of 256: members need no padding.
WIDE = {np.float32: 64, np.float16: 128}


def expect_error(code, fn, *args, **kwargs):
    with pytest.raises(GLib.Error) as info:
        fn(*args, **kwargs)
    assert info.value.matches(Gmlp.error_quark(), code), info.value
    return info.value


def random_sizes(n_groups, total):
    cuts = np.sort(rng.integers(0, total + 1, n_groups - 1))
    return [int(s) for s in np.diff(np.concatenate(([0], cuts, [total])))]


def bf16_round(values):
    """float64 model of round-to-nearest-even to bfloat16 (finite values)."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7fff + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


# numpy -> Gmlp

@pytest.mark.parametrize('dtype', [np.float32, np.float16])
def test_numpy_import_shares_memory(dtype):
    cols = WIDE[dtype]
    sizes = random_sizes(3, 13)
    a = rng.standard_normal((13, cols)).astype(dtype)
    baseline = sys.getrefcount(a)
    t = Gmlp.GroupedTensor.from_dlpack(a, sizes)
    assert t.sizes == tuple(sizes) and t.shape == (13, cols) and t.dtype == np.dtype(dtype)
    assert t.to_bytes().get_data() == a.tobytes()
    assert sys.getrefcount(a) == baseline + 1         # the tensor keeps the array
    # A write through numpy shows in the tensor ...
    a[:] = rng.standard_normal(a.shape)
    assert t.to_bytes().get_data() == a.tobytes()
    # ... and one through libgmlp in the array.
    g = max(range(3), key=lambda i: sizes[i])
    t[g].fill_zero()
    start = sum(sizes[:g])
    assert not a[start:start + sizes[g]].any()
    # The array lives as long as the tensor (and its views) need it.
    view = t[0]
    del t
    gc.collect()
    assert sys.getrefcount(a) == baseline + 1
    del view
    gc.collect()
    assert sys.getrefcount(a) == baseline


def test_numpy_import_released_without_the_gil():
    """The last reference may go in C with the GIL released (ctypes.CDLL
    releases it): the producer's deleter then takes it itself."""
    import ctypes
    gobject = ctypes.CDLL('libgobject-2.0.so.0')
    gobject.g_object_ref.restype = ctypes.c_void_p
    gobject.g_object_ref.argtypes = gobject.g_object_unref.argtypes = [ctypes.c_void_p]
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    a = rng.standard_normal((8, 64)).astype(np.float32)
    baseline = sys.getrefcount(a)
    t = Gmlp.GroupedTensor.from_dlpack(a, [8])
    pointer = gobject.g_object_ref(get(t.__gpointer__, None))
    del t
    gc.collect()
    assert sys.getrefcount(a) == baseline + 1
    gobject.g_object_unref(pointer)
    assert sys.getrefcount(a) == baseline


def test_numpy_import_copies_padded_members():
    sizes = [2, 0, 5]
    a = rng.standard_normal((7, 3)).astype(np.float32)
    baseline = sys.getrefcount(a)
    t = Gmlp.GroupedTensor.from_dlpack(a, sizes)
    assert sys.getrefcount(a) == baseline             # copied, released at once
    assert t.get_member_offset(2) % Gmlp.MEMBER_ALIGNMENT == 0
    assert t.to_bytes().get_data() == a.tobytes()
    a[:] = 0
    assert t.to_bytes().get_data() != a.tobytes()


def test_numpy_import_one_group_and_columns():
    a = rng.integers(-(1 << 40), 1 << 40, 32, dtype=np.int64)
    t = Gmlp.GroupedTensor.from_dlpack(a)             # 1-D: one column, one group
    assert t.shape == (32, 1) and t.sizes == (32,) and t.dtype == np.int64
    assert t.to_ints() == a.tolist()


def test_import_errors():
    a = np.ascontiguousarray(rng.standard_normal((4, 64)), dtype=np.float32)
    baseline = sys.getrefcount(a)
    expect_error(Gmlp.Error.INVALID_ARGUMENT, Gmlp.GroupedTensor.from_dlpack, a.T, [64])
    expect_error(Gmlp.Error.INVALID_ARGUMENT, Gmlp.GroupedTensor.from_dlpack, a[::2], [2])
    expect_error(Gmlp.Error.INVALID_ARGUMENT, Gmlp.GroupedTensor.from_dlpack, a, [1, 2])
    expect_error(Gmlp.Error.INVALID_ARGUMENT, Gmlp.GroupedTensor.from_dlpack,
                 a.reshape(2, 2, 64), [2])
    expect_error(Gmlp.Error.DTYPE_MISMATCH, Gmlp.GroupedTensor.from_dlpack,
                 a.view(np.uint8), [4])
    expect_error(Gmlp.Error.DTYPE_MISMATCH, Gmlp.GroupedTensor.from_dlpack,
                 a.astype(np.float64), [4])
    # Another device: the capsule's DLTensor says CUDA.
    import ctypes
    capsule = a.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    device_type = ctypes.c_int32.from_address(get(capsule, b'dltensor') + ctypes.sizeof(ctypes.c_void_p))
    assert device_type.value == 1
    device_type.value = 2
    expect_error(Gmlp.Error.INVALID_ARGUMENT, Gmlp.GroupedTensor.from_dlpack, capsule, [4],
                 device=DEV)
    # A refused capsule is used up, its export freed at once.
    with pytest.raises(TypeError):
        Gmlp.GroupedTensor.from_dlpack(capsule, [4], device=DEV)
    del capsule
    gc.collect()                                      # the tracebacks above hold views of a
    assert sys.getrefcount(a) == baseline
    # A capsule imports as the array does.
    t = Gmlp.GroupedTensor.from_dlpack(a.__dlpack__(), [4], device=DEV)
    assert t.to_bytes().get_data() == a.tobytes()
    del t
    gc.collect()
    assert sys.getrefcount(a) == baseline             # nothing leaked
    with pytest.raises(TypeError):
        Gmlp.GroupedTensor.from_dlpack([1.0, 2.0], [2])


# Gmlp -> numpy

@pytest.mark.parametrize('dtype,gdtype', [(np.float32, Gmlp.DType.FLOAT32),
                                          (np.float16, Gmlp.DType.FLOAT16)],
                         ids=['float32', 'float16'])
def test_numpy_export_shares_memory(dtype, gdtype):
    cols = WIDE[dtype]
    sizes = [3, 0, 5]
    values = rng.standard_normal(8 * cols)
    t = Gmlp.GroupedTensor.new_from_floats(DEV, gdtype, sizes, cols, values.tolist())
    b = np.asarray(t)
    assert b.shape == (8, cols) and b.dtype == dtype
    # The values pass through float32 (new_from_floats()), then round to dtype.
    want = values.astype(np.float32).astype(dtype).astype(np.float64)
    assert np.array_equal(b.astype(np.float64).ravel(), want)
    assert np.shares_memory(b, np.asarray(t))
    # Writes both ways.
    b[0, :] = 7
    assert t.to_floats()[:cols] == [7.0] * cols
    t[2].fill_zero()
    assert not b[3:].any()
    # The array keeps the storage after the tensor object goes.
    keep = b[:3].copy()
    del t
    gc.collect()
    assert np.array_equal(b[:3], keep)
    # numpy.from_dlpack() shares it too (read-only, numpy's choice).
    t = Gmlp.GroupedTensor.from_dlpack(b, [8])
    assert np.shares_memory(np.from_dlpack(t), b)


def test_asarray_copies_padded_members():
    sizes = [2, 0, 3]
    values = rng.standard_normal(5 * 3)
    t = Gmlp.GroupedTensor.new_from_floats(DEV, Gmlp.DType.FLOAT32, sizes, 3, values.tolist())
    b = np.asarray(t)                                 # no 32-dimension error
    assert b.shape == (5, 3) and b.dtype == np.float32
    assert np.array_equal(b.ravel(), values.astype(np.float32))
    b[:] = 0
    assert np.array_equal(np.asarray(t).ravel(), values.astype(np.float32))
    with pytest.raises(ValueError):
        t.__array__(copy=False)                       # numpy 2's np.asarray(t, copy=False)
    assert np.asarray(t, dtype=np.float64).dtype == np.float64


def test_bfloat16_and_fp8_to_numpy():
    values = rng.standard_normal((4, 128)) * 10
    t = Gmlp.GroupedTensor.new_from_floats(DEV, Gmlp.DType.BFLOAT16, [1, 3], 128,
                                           values.ravel().tolist())
    assert t.dtype == 'bfloat16'
    # numpy has no bfloat16: numpy.from_dlpack() refuses with an error of its
    # own (never SystemError) and the export leaks nothing.
    gc.collect()
    before = DEV.get_bytes_in_use()
    for _ in range(3):
        with pytest.raises(Exception) as info:
            np.from_dlpack(t)
        assert not isinstance(info.value, SystemError)
    gc.collect()
    assert t.__grefcount__ == 1 and DEV.get_bytes_in_use() == before
    # numpy.asarray() widens it to float32.
    b = np.asarray(t)
    assert b.dtype == np.float32 and b.shape == (4, 128)
    assert np.array_equal(b.astype(np.float64), bf16_round(values))
    # FP8: no DLPack code; asarray widens.
    f8 = t.convert(Gmlp.DType.FLOAT8_E4M3)
    assert f8.dtype == 'float8_e4m3fn'
    expect_error(Gmlp.Error.UNSUPPORTED, f8.__dlpack__)
    assert np.asarray(f8).dtype == np.float32 and np.asarray(f8).shape == (4, 128)


# torch on the CPU, both ways

def import_torch():
    # Importing torch leaks a few objects from its module's init, which
    # LeakSanitizer reports at exit (scripts/run-sanitizers.sh preloads its
    # runtime): under it the numpy tests above cover the same C paths.
    if 'libasan' in os.environ.get('LD_PRELOAD', ''):
        pytest.skip('torch leaks at import under LeakSanitizer')
    return pytest.importorskip('torch')


@pytest.mark.parametrize('name', ['float32', 'bfloat16'])
def test_torch_both_ways(name):
    torch = import_torch()
    dtype = getattr(torch, name)
    cols = 64 if name == 'float32' else 128
    sizes = [3, 0, 5, 3]
    x = torch.from_numpy(rng.standard_normal((11, cols))).to(dtype)
    t = Gmlp.GroupedTensor.from_dlpack(x, sizes)
    assert t.dtype == ('bfloat16' if name == 'bfloat16' else np.float32)
    assert t.shape == (11, cols) and t.sizes == tuple(sizes)
    assert t.to_floats() == x.float().flatten().tolist()
    # torch -> Gmlp, zero-copy: writes both ways.
    x[0, 0] = 3.0
    assert t.to_floats()[0] == 3.0
    t.fill_zero()
    assert not x.any()
    # Gmlp -> torch, zero-copy.
    u = Gmlp.GroupedTensor.new_from_floats(DEV, Gmlp.DType.FLOAT32 if name == 'float32'
                                           else Gmlp.DType.BFLOAT16, sizes, cols,
                                           rng.standard_normal(11 * cols).tolist())
    y = torch.from_dlpack(u)
    assert y.dtype == dtype and tuple(y.shape) == (11, cols)
    assert y.float().flatten().tolist() == u.to_floats()
    y[1, :] = -2.0
    assert u.to_floats()[cols:2 * cols] == [-2.0] * cols
    u[0].fill_zero()
    assert not y[:3].any() and y[3:].all()
    # And back: a torch tensor over libgmlp's storage imports again as it is.
    again = Gmlp.GroupedTensor.from_dlpack(y, sizes[::-1])
    assert again.sizes == tuple(sizes[::-1])
    assert again.to_bytes().get_data() == u.to_bytes().get_data()


def test_torch_non_contiguous_refused():
    torch = import_torch()
    x = torch.zeros(64, 8)
    expect_error(Gmlp.Error.INVALID_ARGUMENT, Gmlp.GroupedTensor.from_dlpack, x.t(), [8])
    expect_error(Gmlp.Error.DTYPE_MISMATCH, Gmlp.GroupedTensor.from_dlpack,
                 torch.zeros(4, 64, dtype=torch.float64), [4])


# The array-like properties

def test_shape_dtype_sizes():
    for gdtype, want in [(Gmlp.DType.FLOAT32, np.dtype(np.float32)),
                         (Gmlp.DType.FLOAT16, np.dtype(np.float16)),
                         (Gmlp.DType.INT32, np.dtype(np.int32)),
                         (Gmlp.DType.INT64, np.dtype(np.int64)),
                         (Gmlp.DType.BFLOAT16, 'bfloat16'),
                         (Gmlp.DType.FLOAT8_E4M3, 'float8_e4m3fn'),
                         (Gmlp.DType.FLOAT8_E5M2, 'float8_e5m2')]:
        t = Gmlp.GroupedTensor.new(DEV, gdtype, [2, 0, 3], 16)
        assert t.shape == (5, 16) and t.sizes == (2, 0, 3) and t.dtype == want
        assert len(t) == 3 and t[2].shape == (3, 16)
    sizes = Gmlp.GroupedTensor.new_from_ints(DEV, Gmlp.DType.INT64, [3], 1, [4, 0, 2])
    d = Gmlp.GroupedTensor.new_with_device_sizes(DEV, Gmlp.DType.FLOAT32, sizes, 10, 64)
    assert d.shape == (None, 64) and d.sizes is None
    assert np.asarray(d).shape == (6, 64)


def test_help():
    text = pydoc.render_doc(Gmlp.GroupedTensor)
    for what in ('from_dlpack', 'numpy.asarray', '__dlpack__', 'shape', 'dtype', 'sizes',
                 'new_from_floats'):
        assert what in text, what


# The typed-array constructors and readers: plain lists, no GLib.Bytes

def test_typed_arrays():
    values = rng.standard_normal(7 * 5) * 100
    for gdtype, model in [(Gmlp.DType.FLOAT32, lambda v: v.astype(np.float32)),
                          (Gmlp.DType.FLOAT16, lambda v: v.astype(np.float16)),
                          (Gmlp.DType.BFLOAT16, bf16_round)]:
        t = Gmlp.GroupedTensor.new_from_floats(DEV, gdtype, [3, 0, 4], 5, values.tolist())
        assert t.get_dtype() == gdtype
        assert t.to_floats() == model(values.astype(np.float32)).astype(np.float64).tolist()
    ints = rng.integers(-(1 << 62), 1 << 62, 12).tolist()
    t = Gmlp.GroupedTensor.new_from_ints(DEV, Gmlp.DType.INT64, [12], 1, ints)
    assert t.to_ints() == ints
    expect_error(Gmlp.Error.INVALID_ARGUMENT, Gmlp.GroupedTensor.new_from_ints, DEV,
                 Gmlp.DType.INT32, [12], 1, ints)
    bits = rng.standard_normal(6).astype(np.float16).view(np.uint16).tolist()
    h = Gmlp.GroupedTensor.new_from_uint16(DEV, Gmlp.DType.FLOAT16, [2, 1], 2, bits)
    assert h.to_uint16() == bits
    assert h.to_floats() == np.array(bits, np.uint16).view(np.float16).astype(np.float64).tolist()
    expect_error(Gmlp.Error.INVALID_ARGUMENT, Gmlp.GroupedTensor.new_from_floats, DEV,
                 Gmlp.DType.FLOAT32, [3, 0, 4], 5, values[:-1].tolist())
    expect_error(Gmlp.Error.DTYPE_MISMATCH, Gmlp.GroupedTensor.new_from_floats, DEV,
                 Gmlp.DType.INT64, [12], 1, [0.0] * 12)
    expect_error(Gmlp.Error.DTYPE_MISMATCH, t.to_uint16)
    expect_error(Gmlp.Error.UNSUPPORTED, t.to_floats)
