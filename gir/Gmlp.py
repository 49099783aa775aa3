# PyGObject overrides for Gmlp: Pythonic sugar only.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import contextlib
import ctypes
import sys

import gi
from gi.repository import GLib

from ..overrides import override
from ..module import get_introspection_module

Gmlp = get_introspection_module('Gmlp')

__all__ = []


# DLPack: a capsule named "dltensor" around gmlp_grouped_tensor_to_dlpack()'s
# DLManagedTensor. A consumer renames it and calls the deleter when done; a
# capsule dropped unconsumed calls it here. The C functions of the DLPack
# exchange are not in the typelib (a raw pointer that no binding can free
# would leak), so they are called through ctypes.
class _GError(ctypes.Structure):
    _fields_ = [('domain', ctypes.c_uint32),
                ('code', ctypes.c_int),
                ('message', ctypes.c_char_p)]


# dlpack.h's DLManagedTensor, as far as from_dlpack() reads it.
class _DLTensorHead(ctypes.Structure):
    _fields_ = [('data', ctypes.c_void_p),
                ('device', ctypes.c_int32 * 2),
                ('ndim', ctypes.c_int32),
                ('dtype', ctypes.c_uint32),
                ('shape', ctypes.POINTER(ctypes.c_int64)),
                ('strides', ctypes.POINTER(ctypes.c_int64)),
                ('byte_offset', ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DLManagedTensor._fields_ = [('dl_tensor', _DLTensorHead),
                             ('manager_ctx', ctypes.c_void_p),
                             ('deleter', ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor)))]


def _library():
    gi.require_version('GIRepository', '2.0')
    from gi.repository import GIRepository
    # The typelib may name other libraries first (a sanitizer's runtime).
    names = GIRepository.Repository.get_default().get_shared_library('Gmlp').split(',')
    library = ctypes.CDLL(next(name for name in names if 'gmlp' in name))
    error_p = ctypes.POINTER(ctypes.POINTER(_GError))
    library.gmlp_grouped_tensor_to_dlpack.restype = ctypes.c_void_p
    library.gmlp_grouped_tensor_to_dlpack.argtypes = [ctypes.c_void_p, error_p]
    library.gmlp_dlpack_python_guard.restype = ctypes.POINTER(_DLManagedTensor)
    library.gmlp_dlpack_python_guard.argtypes = [ctypes.c_void_p]
    library.gmlp_grouped_tensor_new_from_dlpack.restype = ctypes.c_void_p
    library.gmlp_grouped_tensor_new_from_dlpack.argtypes = [
        ctypes.c_void_p, ctypes.POINTER(_DLManagedTensor), ctypes.POINTER(ctypes.c_int64),
        ctypes.c_uint, error_p]
    return library


_lib = _library()
_glib = ctypes.CDLL('libglib-2.0.so.0')
_glib.g_error_free.argtypes = [ctypes.POINTER(_GError)]
_glib.g_quark_to_string.restype = ctypes.c_char_p
_gobject = ctypes.CDLL('libgobject-2.0.so.0')
_gobject.g_object_unref.argtypes = [ctypes.c_void_p]

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
# The capsules' destructor is C (gmlp_dlpack_capsule_destructor()): a
# consumer that refuses a tensor drops the capsule with its exception
# pending, when no Python code, a ctypes callback included, can run.
_capsule_destructor = ctypes.cast(_lib.gmlp_dlpack_capsule_destructor, ctypes.c_void_p)


# pygobject_new() from PyGObject's C API (pygobject.h): the Python wrapper of
# a GObject pointer that came from ctypes. It takes a reference of its own.
class _PyGObjectFunctions(ctypes.Structure):
    _fields_ = [('register_class', ctypes.c_void_p),
                ('register_wrapper', ctypes.c_void_p),
                ('lookup_class', ctypes.c_void_p),
                ('newgobj', ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p))]


def _pygobject_new():
    from gi import _gi
    capsule = _gi._PyGObject_API
    _api.PyCapsule_GetName.restype = ctypes.c_char_p
    _api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    address = _api.PyCapsule_GetPointer(capsule, _api.PyCapsule_GetName(capsule))
    return _PyGObjectFunctions.from_address(address).newgobj


_wrap_gobject = _pygobject_new()


def _gobject_pointer(obj):
    """The GObject * of a wrapper, valid while the wrapper lives."""
    return _api.PyCapsule_GetPointer(obj.__gpointer__, None)


def _raise_gerror(error):
    e = error.contents
    raised = GLib.Error(e.message.decode('utf-8', 'replace'),
                        _glib.g_quark_to_string(e.domain).decode(), e.code)
    _glib.g_error_free(error)
    raise raised


def _to_dlpack_capsule(tensor):
    error = ctypes.POINTER(_GError)()
    pointer = _lib.gmlp_grouped_tensor_to_dlpack(_gobject_pointer(tensor), ctypes.byref(error))
    if not pointer:
        _raise_gerror(error)
    return _api.PyCapsule_New(pointer, b'dltensor', _capsule_destructor)


# What .dtype says for the types that numpy has no name for (torch's and
# ml_dtypes' names).
_DTYPE_NAMES = {
    Gmlp.DType.BFLOAT16: 'bfloat16',
    Gmlp.DType.FLOAT8_E4M3: 'float8_e4m3fn',
    Gmlp.DType.FLOAT8_E5M2: 'float8_e5m2',
}
_NUMPY_TYPES = {
    Gmlp.DType.FLOAT32: 'float32',
    Gmlp.DType.FLOAT16: 'float16',
    Gmlp.DType.INT32: 'int32',
    Gmlp.DType.INT64: 'int64',
}


def _device_of(obj):
    """The Gmlp.Device where a DLPack producer's data lives."""
    kind, ordinal = obj.__dlpack_device__() if hasattr(obj, '__dlpack_device__') else (1, 0)
    if kind in (1, 3):      # kDLCPU, kDLCUDAHost
        return Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0)
    if kind == 2:           # kDLCUDA
        return Gmlp.Device.new(Gmlp.DeviceKind.CUDA, ordinal)
    raise BufferError('no Gmlp device for DLPack device type %d' % kind)


def _wait_for_producer(obj, device):
    """Makes a GPU producer's pending work complete before libgmlp reads the
    data: libgmlp's stream does not follow the producer's (torch's current
    stream) by itself."""
    if device.get_kind() != Gmlp.DeviceKind.CUDA:
        return
    torch = sys.modules.get('torch')
    if torch is not None and isinstance(obj, torch.Tensor) and obj.is_cuda:
        torch.cuda.current_stream(obj.device).synchronize()


class _ArrayExport:
    """A DLPack export seen through numpy's array interface: unlike
    numpy.from_dlpack()'s read-only arrays, the array is writable. The array
    keeps this object, which keeps the export's capsule, alive."""

    def __init__(self, tensor, dtype):
        self._capsule = _to_dlpack_capsule(tensor)
        head = _DLTensorHead.from_address(_api.PyCapsule_GetPointer(self._capsule, b'dltensor'))
        self.__array_interface__ = {
            'version': 3,
            'shape': (head.shape[0], head.shape[1]),
            'typestr': dtype.str,
            'data': (head.data, False),
        }


class GroupedTensor(Gmlp.GroupedTensor):
    """N member matrices (rows[i] x cols) packed in one allocation.

    In Python a GroupedTensor also behaves like an array:

    - ``t.shape`` is ``(total rows, cols)``, ``t.dtype`` a numpy dtype (the
      strings ``'bfloat16'``, ``'float8_e4m3fn'`` and ``'float8_e5m2'`` for
      the types numpy lacks) and ``t.sizes`` the rows of each group;
      ``len(t)`` is the number of groups and ``t[i]`` a member view sharing
      the storage.
    - ``numpy.asarray(t)`` gives the values as a (total rows, cols) array:
      without a copy where the members are contiguous on the CPU, a copy
      otherwise (padded members, a GPU, bfloat16 and FP8 widened to float32).
    - The DLPack protocol: ``numpy.from_dlpack(t)``, ``torch.from_dlpack(t)``
      share the storage; ``Gmlp.GroupedTensor.from_dlpack(obj, sizes)``
      takes any ``__dlpack__`` producer's matrix the other way.
    - Plain lists in and out: ``new_from_floats``, ``new_from_ints``,
      ``new_from_uint16`` and ``to_floats``, ``to_ints``, ``to_uint16``.

    Errors are ``GLib.Error`` in the ``gmlp-error-quark`` domain
    (``e.matches(Gmlp.error_quark(), Gmlp.Error.INVALID_ARGUMENT)``).
    """

    @classmethod
    def from_dlpack(cls, obj, sizes=None, device=None):
        """A GroupedTensor over a DLPack producer's matrix.

        obj: an object with ``__dlpack__`` (a numpy array, a torch tensor on
        the CPU or a GPU, ...) or a ``"dltensor"`` capsule, holding a
        row-major, compact (total rows, cols) matrix (a 1-D array is one
        column) of float32, float16, bfloat16, int32 or int64.
        sizes: the rows of each group, in order, adding up to the matrix's
        rows; None for one group of all rows.
        device: the Gmlp.Device the data is on; by default the producer's
        (``__dlpack_device__``; the CPU for a bare capsule).

        The tensor shares the producer's memory where the layout allows (each
        group's bytes a multiple of 256, e.g. ``cols * itemsize`` a multiple
        of 256), and keeps the producer's tensor alive as long as it needs
        it; otherwise it is a copy with the members padded apart. Raises
        GLib.Error (nothing is kept then) for another dtype, a device that
        is not the data's, non-compact strides (make the array contiguous
        first) or sizes that do not add up to the rows.
        """
        if device is None:
            device = _device_of(obj)
        if hasattr(obj, '__dlpack__'):
            _wait_for_producer(obj, device)
            capsule = obj.__dlpack__()
        else:
            capsule = obj
        if not _api.PyCapsule_IsValid(capsule, b'dltensor'):
            raise TypeError('from_dlpack() takes an object with __dlpack__ or an unused '
                            '"dltensor" capsule, not %s' % type(obj).__name__)
        managed = _api.PyCapsule_GetPointer(capsule, b'dltensor')
        if sizes is None:
            head = _DLTensorHead.from_address(managed)
            sizes = [head.shape[0] if head.ndim >= 1 else 0]
        sizes = [int(s) for s in sizes]
        rows = (ctypes.c_int64 * max(len(sizes), 1))(*sizes)
        error = ctypes.POINTER(_GError)()
        # The guard owns the producer's tensor from here on (and holds the
        # GIL around its deleter, which may run on any thread).
        guarded = _lib.gmlp_dlpack_python_guard(managed)
        _api.PyCapsule_SetName(capsule, b'used_dltensor')
        pointer = _lib.gmlp_grouped_tensor_new_from_dlpack(
            _gobject_pointer(device), guarded, rows, len(sizes),
            ctypes.byref(error))
        if not pointer:
            guarded.contents.deleter(guarded)
            _raise_gerror(error)
        tensor = _wrap_gobject(pointer)
        _gobject.g_object_unref(pointer)
        return tensor

    def __dlpack__(self, stream=None, **kwargs):
        """A DLPack capsule sharing the storage (the DLPack protocol).

        The tensor must be one array: host sizes, no padding between members
        (``cols * itemsize`` a multiple of 256, or one group; a member view
        always is), a dtype with a DLPack code (not FP8). Raises GLib.Error
        otherwise. numpy has no bfloat16, and refuses it (``numpy.asarray(t)``
        gives float32 values instead); torch takes it.
        """
        # to_dlpack() waits for the device, so any consumer stream may read.
        return _to_dlpack_capsule(self)

    def to_dlpack(self):
        """The tensor as a DLPack capsule ("dltensor") that owns its
        reference: what `__dlpack__` gives, for consumers that take a
        capsule. Raises GLib.Error where the tensor is not one array."""
        return _to_dlpack_capsule(self)

    def __dlpack_device__(self):
        """(DLPack device type, ordinal): (1, 0) on the CPU, (2, n) on GPU n."""
        device = self.get_device()
        return (2 if device.get_kind() == Gmlp.DeviceKind.CUDA else 1, device.get_ordinal())

    def __array__(self, dtype=None, copy=None):
        """The values as a numpy array of shape (total rows, cols).

        Shares the storage where it can (CPU, host sizes, no padding
        between members, a numpy dtype); copies otherwise, widening
        bfloat16 and FP8 (dequantized with their scales) to float32.
        """
        import numpy
        array = None
        if copy is not True and self.get_dtype() in _NUMPY_TYPES and \
                self.get_device().get_kind() == Gmlp.DeviceKind.CPU:
            try:
                holder = _ArrayExport(self, numpy.dtype(_NUMPY_TYPES[self.get_dtype()]))
                array = numpy.asarray(holder)
            except GLib.Error:
                array = None
        if array is None:
            if copy is False:
                raise ValueError('this GroupedTensor cannot be an array without a copy '
                                 '(padded members, device sizes, a GPU or no numpy dtype)')
            source = self
            if self.get_dtype() not in _NUMPY_TYPES:
                source = self.convert(Gmlp.DType.FLOAT32)
            kind = _NUMPY_TYPES[source.get_dtype()]
            array = numpy.frombuffer(source.to_bytes().get_data(), dtype=kind).copy()
            array = array.reshape(-1, self.get_cols())
        if dtype is not None:
            array = array.astype(dtype, copy=False)
        return array

    def __len__(self):
        """The number of groups (not of rows, as numpy's len would be)."""
        return self.get_n_groups()

    def __getitem__(self, index):
        """Member view index (negative counts from the end): shares the storage."""
        if not isinstance(index, int):
            raise TypeError('member index must be an int')
        if index < 0:
            index += self.get_n_groups()
        if not 0 <= index < self.get_n_groups():
            raise IndexError('member index out of range')
        return self.get_member(index)

    @property
    def shape(self):
        """(total rows, cols), as numpy's; the rows are None for sizes known
        only on the device (read_sizes() reads them)."""
        if not self.has_host_sizes():
            return (None, self.get_cols())
        return (self.get_total_rows(), self.get_cols())

    @property
    def sizes(self):
        """The rows of each group, a tuple; None for device-only sizes."""
        if not self.has_host_sizes():
            return None
        return tuple(self.get_rows(i) for i in range(self.get_n_groups()))

    @property
    def dtype(self):
        """The element type as a numpy dtype (a string for bfloat16 and FP8,
        which numpy lacks; the Gmlp.DType is get_dtype())."""
        dtype = self.get_dtype()
        if dtype in _NUMPY_TYPES:
            try:
                import numpy
                return numpy.dtype(_NUMPY_TYPES[dtype])
            except ImportError:
                return _NUMPY_TYPES[dtype]
        return _DTYPE_NAMES[dtype]

    def __repr__(self):
        return '<Gmlp.GroupedTensor %s groups=%d cols=%d on %s>' % (
            Gmlp.dtype_get_name(self.get_dtype()), self.get_n_groups(),
            self.get_cols(), self.get_device().get_name())


GroupedTensor = override(GroupedTensor)
__all__.append('GroupedTensor')


class OffloadContext(Gmlp.OffloadContext):
    """An offload context; `with ctx.enabled():` and `with ctx.disabled():`
    push it for the calling thread and pop it on the way out, also on errors."""

    @contextlib.contextmanager
    def _pushed(self, enabled):
        self.push_thread_default(enabled)
        try:
            yield self
        finally:
            self.pop_thread_default()

    def enabled(self):
        return self._pushed(True)

    def disabled(self):
        return self._pushed(False)


OffloadContext = override(OffloadContext)
__all__.append('OffloadContext')
