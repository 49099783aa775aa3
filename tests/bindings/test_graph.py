#!/usr/bin/python3
# Python binding test: the graph capture API is there, and on the CPU a
# capture is refused with GLib.Error in the GMLP_ERROR domain.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os

import gi

gi.require_version('Gmlp', '1.0')
from gi.repository import GLib, GObject, Gmlp  # noqa: E402


def expect_error(code, fn, *args):
    try:
        fn(*args)
    except GLib.Error as e:
        assert e.matches(Gmlp.error_quark(), code), e
        return e
    raise AssertionError('%s did not fail' % fn.__name__)


def test_api():
    assert issubclass(Gmlp.Graph, GObject.Object)
    for name in ('begin_capture', 'end_capture', 'is_capturing'):
        assert callable(getattr(Gmlp.Device, name)), name
    for name in ('replay', 'get_device'):
        assert callable(getattr(Gmlp.Graph, name)), name
    assert 'device' in [p.name for p in Gmlp.Graph.list_properties()]


def test_cpu_refused():
    dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0)
    assert not dev.is_capturing()
    expect_error(Gmlp.Error.UNSUPPORTED, dev.begin_capture)
    assert not dev.is_capturing()
    expect_error(Gmlp.Error.INVALID_STATE, dev.end_capture)
    # The device works as before.
    x = Gmlp.GroupedTensor.new_uniform(dev, Gmlp.DType.FLOAT32, 2, 3, 4)
    x.fill_zero()
    assert x.to_bytes().get_data() == bytes(2 * 3 * 4 * 4)
    dev.synchronize()
