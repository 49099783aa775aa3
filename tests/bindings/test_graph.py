#!/usr/bin/python3
# Python binding test: the graph capture API is there, and on the CPU a
# capture is refused with GLib.Error in the GMLP_ERROR domain.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os
import sys

import gi
import gi.overrides

overrides_dir = os.environ.get('GMLP_OVERRIDES_DIR')
if overrides_dir:
    gi.overrides.__path__.insert(0, overrides_dir)

gi.require_version('Gmlp', '1.0')
from gi.repository import GLib, GObject, Gmlp  # noqa: E402

results = []


def check(name, fn):
    try:
        fn()
        results.append(('ok', name, ''))
    except Exception as e:  # report every failure as TAP
        results.append(('not ok', name, repr(e)))


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


for name, fn in [('graph-api', test_api), ('graph-cpu-refused', test_cpu_refused)]:
    check(name, fn)

print('1..%d' % len(results))
for i, (status, name, why) in enumerate(results, 1):
    print('%s %d /Gmlp/Python/%s%s' % (status, i, name, (' # ' + why) if why else ''))
sys.exit(0 if all(r[0] == 'ok' for r in results) else 1)
