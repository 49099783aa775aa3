#!/usr/bin/python3
# Python binding test: GmlpOffloadContext as nested context managers; which
# forwards offloaded, and results identical with and without offload.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os

import gi

gi.require_version('Gmlp', '1.0')
from gi.repository import GLib, Gmlp  # noqa: E402


def test_offload_context():
    dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0)
    ctx = Gmlp.OffloadContext.new(dev)
    layers = [Gmlp.GroupedLinear.new(dev, 2, 8, 8) for _ in range(3)]
    for i, layer in enumerate(layers):
        layer.init_parameters(i + 1)
    x = Gmlp.GroupedTensor.new_uniform(dev, Gmlp.DType.FLOAT32, 2, 5, 8)
    x.fill_random(7, 1.0)

    def run(offload):
        told, outs = [], []
        if offload:
            with ctx.enabled():
                y0, s0 = layers[0].forward(x)
                with ctx.disabled():
                    y1, s1 = layers[1].forward(y0)
                y2, s2 = layers[2].forward(y1)
        else:
            y0, s0 = layers[0].forward(x)
            y1, s1 = layers[1].forward(y0)
            y2, s2 = layers[2].forward(y1)
        told = [s.props.offload for s in (s0, s1, s2)]
        dy = y2
        for layer, saved in zip(reversed(layers), (s2, s1, s0)):
            dy = layer.backward(saved, dy)
            outs.append(layer.get_wgrad().to_bytes().get_data())
        outs.append(dy.to_bytes().get_data())
        return told, outs

    told_plain, plain = run(False)
    told_off, off = run(True)
    assert told_plain == [False, False, False], told_plain
    assert told_off == [True, False, True], told_off
    assert plain == off, 'results differ with offload'
    assert ctx.props.bytes_offloaded > 0 and ctx.props.bytes_on_host == 0
    assert Gmlp.OffloadContext.get_depth() == 0

    # An error inside the block still pops the context.
    try:
        with ctx.enabled():
            raise KeyError('boom')
    except KeyError:
        pass
    assert Gmlp.OffloadContext.get_depth() == 0
    try:
        ctx.pop_thread_default()
        raise AssertionError('no error for an unbalanced pop')
    except GLib.Error as e:
        assert e.matches(Gmlp.error_quark(), Gmlp.Error.INVALID_STATE), e
