# PyGObject overrides for Gmlp: Pythonic sugar only.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import contextlib

from ..overrides import override
from ..module import get_introspection_module

Gmlp = get_introspection_module('Gmlp')

__all__ = []


class GroupedTensor(Gmlp.GroupedTensor):
    """A grouped tensor; `len()` is the number of groups, `t[i]` a member view."""

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
