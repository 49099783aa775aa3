# PyGObject overrides for Gmlp: Pythonic sugar only.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import contextlib
import ctypes

import gi
from gi.repository import GLib

from ..overrides import override
from ..module import get_introspection_module

Gmlp = get_introspection_module('Gmlp')

__all__ = []


# DLPack: a capsule named "dltensor" around gmlp_grouped_tensor_to_dlpack()'s
# DLManagedTensor. A consumer renames it and calls the deleter when done; a
# capsule dropped unconsumed calls it here. The C function is not in the
# typelib (a raw pointer that no binding can free would leak), so it is
# called through ctypes.
class _GError(ctypes.Structure):
    _fields_ = [('domain', ctypes.c_uint32),
                ('code', ctypes.c_int),
                ('message', ctypes.c_char_p)]


def _library():
    gi.require_version('GIRepository', '2.0')
    from gi.repository import GIRepository
    # The typelib may name other libraries first (a sanitizer's runtime).
    names = GIRepository.Repository.get_default().get_shared_library('Gmlp').split(',')
    library = ctypes.CDLL(next(name for name in names if 'gmlp' in name))
    library.gmlp_grouped_tensor_to_dlpack.restype = ctypes.c_void_p
    library.gmlp_grouped_tensor_to_dlpack.argtypes = [ctypes.c_void_p,
                                                      ctypes.POINTER(ctypes.POINTER(_GError))]
    return library


_lib = _library()
_glib = ctypes.CDLL('libglib-2.0.so.0')
_glib.g_error_free.argtypes = [ctypes.POINTER(_GError)]
_glib.g_quark_to_string.restype = ctypes.c_char_p

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
# The capsules' destructor is C (gmlp_dlpack_capsule_destructor()): a
# consumer that refuses a tensor drops the capsule with its exception
# pending, when no Python code, a ctypes callback included, can run.
_capsule_destructor = ctypes.cast(_lib.gmlp_dlpack_capsule_destructor, ctypes.c_void_p)


def _to_dlpack_capsule(tensor):
    error = ctypes.POINTER(_GError)()
    handle = tensor.__gpointer__  # a capsule around the GObject, kept alive here
    gobject = _api.PyCapsule_GetPointer(id(handle), None)
    pointer = _lib.gmlp_grouped_tensor_to_dlpack(gobject, ctypes.byref(error))
    if not pointer:
        e = error.contents
        raised = GLib.Error(e.message.decode('utf-8', 'replace'),
                            _glib.g_quark_to_string(e.domain).decode(), e.code)
        _glib.g_error_free(error)
        raise raised
    return _api.PyCapsule_New(pointer, b'dltensor', _capsule_destructor)


class GroupedTensor(Gmlp.GroupedTensor):
    """A grouped tensor; `len()` is the number of groups, `t[i]` a member view,
    and the DLPack protocol exports it without a copy (`numpy.from_dlpack(t)`)."""

    def __dlpack__(self, stream=None, **kwargs):
        # to_dlpack() waits for the device, so any consumer stream may read.
        return _to_dlpack_capsule(self)

    def to_dlpack(self):
        """The tensor as a DLPack capsule ("dltensor") that owns its
        reference: what `__dlpack__` gives, for consumers that take a
        capsule. Raises GLib.Error where the tensor is not one array."""
        return _to_dlpack_capsule(self)

    def __dlpack_device__(self):
        device = self.get_device()
        return (2 if device.get_kind() == Gmlp.DeviceKind.CUDA else 1, device.get_ordinal())

    def __len__(self):
        return self.get_n_groups()

    def __getitem__(self, index):
        if not isinstance(index, int):
            raise TypeError('member index must be an int')
        if index < 0:
            index += self.get_n_groups()
        if not 0 <= index < self.get_n_groups():
            raise IndexError('member index out of range')
        return self.get_member(index)

    @property
    def shape(self):
        """(rows per group, cols); rows is None for device-only sizes."""
        if not self.has_host_sizes():
            return (None, self.get_cols())
        return (tuple(self.get_rows(i) for i in range(self.get_n_groups())),
                self.get_cols())

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
