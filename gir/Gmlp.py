# PyGObject overrides for Gmlp: Pythonic sugar only.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import contextlib
import ctypes

from ..overrides import override
from ..module import get_introspection_module

Gmlp = get_introspection_module('Gmlp')

__all__ = []


# DLPack: a capsule named "dltensor" around gmlp_grouped_tensor_to_dlpack()'s
# DLManagedTensor. A consumer renames it and calls the deleter when done; a
# capsule dropped unconsumed calls it here.
class _DLManagedTensor(ctypes.Structure):
    _fields_ = [('dl_tensor', ctypes.c_byte * 48),
                ('manager_ctx', ctypes.c_void_p),
                ('deleter', ctypes.CFUNCTYPE(None, ctypes.c_void_p))]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_get_pointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _dlpack_capsule_destructor(capsule):
    if _capsule_is_valid(capsule, b'dltensor'):
        pointer = _capsule_get_pointer(capsule, b'dltensor')
        managed = _DLManagedTensor.from_address(pointer)
        managed.deleter(pointer)


class GroupedTensor(Gmlp.GroupedTensor):
    """A grouped tensor; `len()` is the number of groups, `t[i]` a member view,
    and the DLPack protocol exports it without a copy (`numpy.from_dlpack(t)`)."""

    def __dlpack__(self, stream=None, **kwargs):
        # to_dlpack() waits for the device, so any consumer stream may read.
        pointer = self.to_dlpack()
        return _capsule_new(pointer, b'dltensor',
                            ctypes.cast(_dlpack_capsule_destructor, ctypes.c_void_p))

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
