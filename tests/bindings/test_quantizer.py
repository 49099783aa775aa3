#!/usr/bin/python3
# Python binding test of GmlpQuantizer: quantize against a float64 reference
# (current, blockwise and MXFP8 scaling), the columnwise copy, dequantize,
# delayed scaling's state through a GLib.Variant, errors as GLib.Error.
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


E4M3 = dict(mbits=3, emin=-6, max=448.0, emax=8)


def f32(x):
    """x rounded to float32."""
    return struct.unpack('<f', struct.pack('<f', x))[0]


def e4m3_round(x):
    """float64 model of round-to-nearest-even to E4M3, saturating."""
    if math.isnan(x):
        return x
    if math.isinf(x):
        return math.copysign(E4M3['max'], x)
    if x == 0:
        return x
    m, e = math.frexp(x)
    quantum = math.ldexp(1.0, max(e - 1, E4M3['emin']) - E4M3['mbits'])
    r = round(x / quantum) * quantum     # Python's round() is ties-to-even
    return math.copysign(min(abs(r), E4M3['max']), x)


def e4m3_decode(b):
    sign = -1.0 if b & 0x80 else 1.0
    e = (b >> 3) & 0xf
    m = b & 7
    if e == 15 and m == 7:
        return math.nan
    if e == 0:
        return sign * math.ldexp(m, -9)
    return sign * math.ldexp(1.0 + m / 8.0, e - 7)


def source(dev, rows, cols, scale):
    n = sum(rows) * cols
    values = [f32(random.gauss(0.0, scale)) for _ in range(n)]
    data = struct.pack('<%df' % n, *values)
    t = Gmlp.GroupedTensor.new_from_bytes(dev, Gmlp.DType.FLOAT32, rows, cols,
                                          GLib.Bytes.new(data))
    return t, values


def reference(values, rows, cols, block_rows, block_cols, mx):
    """Expected FP8 values and scale inverses (rowwise), packed."""
    want = [0.0] * len(values)
    scales = []
    base = 0
    for m in rows:
        nbr = 1 if block_rows == 0 else -(-m // block_rows)
        nbc = 1 if block_cols == 0 else -(-cols // block_cols)
        for bi in range(nbr):
            for bj in range(nbc):
                r0 = bi * block_rows
                r1 = m if block_rows == 0 else min(r0 + block_rows, m)
                c0 = bj * block_cols
                c1 = cols if block_cols == 0 else min(c0 + block_cols, cols)
                block = [(r, c) for r in range(r0, r1) for c in range(c0, c1)]
                amax = max([abs(values[base + r * cols + c]) for r, c in block], default=0.0)
                if mx:
                    e = 0 if amax == 0 else math.frexp(amax)[1] - 1 - E4M3['emax']
                    mult, inv = math.ldexp(1.0, -e), math.ldexp(1.0, e)
                    scales.append(e + 127)
                else:
                    mult = 1.0 if amax == 0 else f32(E4M3['max'] / amax)
                    inv = f32(1.0 / mult)
                    scales.append(inv)
                for r, c in block:
                    i = base + r * cols + c
                    want[i] = (e4m3_round(f32(values[i] * mult)), inv,
                               abs(f32(values[i] * mult)) > E4M3['max'])
        base += m * cols
    return want, scales


def test_recipes():
    dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0)
    rows = [random.randint(0, 9) for _ in range(3)] + [0, 140]
    cols = random.randint(1, 70)
    x, values = source(dev, rows, cols, 3.0)
    for recipe, mx in [(Gmlp.ScalingRecipe.CURRENT, False), (Gmlp.ScalingRecipe.BLOCKWISE, False),
                       (Gmlp.ScalingRecipe.MXFP8, True)]:
        q = Gmlp.Quantizer.new(dev, recipe, Gmlp.Fp8Format.HYBRID, Gmlp.QuantizerRole.INPUT)
        assert q.props.dtype == Gmlp.DType.FLOAT8_E4M3 and q.get_recipe() == recipe
        x8 = q.quantize(x)
        assert x8.get_dtype() == Gmlp.DType.FLOAT8_E4M3 and x8.get_scaling_recipe() == recipe
        ok, br, bc = x8.get_scale_block()
        assert ok
        want, scales = reference(values, rows, cols, br, bc, mx)
        got = x8.to_bytes().get_data()
        for i, b in enumerate(got):
            v = want[i][0]
            assert e4m3_decode(b) == v, (recipe, i, e4m3_decode(b), v)
        raw = x8.get_scale_inv().to_bytes().get_data()
        got_scales = list(raw) if mx else list(struct.unpack('<%df' % (len(raw) // 4), raw))
        assert got_scales == scales, (recipe, got_scales[:8], scales[:8])
        back = x8.dequantize(Gmlp.DType.FLOAT32)
        got_back = struct.unpack('<%df' % len(values), back.to_bytes().get_data())
        for i, g in enumerate(got_back):
            v, inv, saturated = want[i]
            assert g == f32(v * inv), (recipe, i, g, v * inv)
            # Half an E4M3 ulp, or half its smallest subnormal, scaled back;
            # the top of an MX block may saturate (the OCP rule).
            if saturated:
                assert abs(g) == f32(E4M3['max'] * inv), (i, g, values[i])
            else:
                assert abs(g - values[i]) <= abs(values[i]) / 16 + math.ldexp(inv, -10) + 1e-30, \
                    (i, g, values[i])


def test_columnwise():
    dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0)
    rows = [5, 0, 3]
    cols = 11
    x, values = source(dev, rows, cols, 1.0)
    q = Gmlp.Quantizer(device=dev, recipe=Gmlp.ScalingRecipe.CURRENT, columnwise=True,
                       fp8_format=Gmlp.Fp8Format.E4M3, role=Gmlp.QuantizerRole.INPUT)
    x8 = q.quantize(x)
    col = x8.get_columnwise()
    assert col is not None and col.is_columnwise() and not x8.is_columnwise()
    row_bytes, col_bytes = x8.to_bytes().get_data(), col.to_bytes().get_data()
    base = 0
    for m in rows:
        for r in range(m):
            for c in range(cols):
                assert col_bytes[base + c * m + r] == row_bytes[base + r * cols + c]
        base += m * cols


def test_delayed_state():
    dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0)
    q = Gmlp.Quantizer(device=dev, recipe=Gmlp.ScalingRecipe.DELAYED, amax_history_length=2,
                       margin=0, fp8_format=Gmlp.Fp8Format.HYBRID,
                       role=Gmlp.QuantizerRole.GRAD_OUTPUT)
    assert q.get_dtype() == Gmlp.DType.FLOAT8_E5M2
    rows = [4, 6]
    amaxes = []
    for step in range(3):
        x, values = source(dev, rows, 8, 2.0 ** step)
        q.quantize(x)
        q.update()
        amaxes.append([max(abs(v) for v in values[:32]), max(abs(v) for v in values[32:])])
    state = q.save_state()
    assert isinstance(state, GLib.Variant) and state.get_type_string() == 'a{sv}'
    d = state.unpack()
    assert d['recipe'] == 'delayed' and d['n-groups'] == 2 and d['amax-history-length'] == 2
    for g in range(2):
        assert d['amax-history'][2 * g:2 * g + 2] == [amaxes[2][g], amaxes[1][g]]
        assert d['scale'][g] == f32(57344.0 / max(amaxes[2][g], amaxes[1][g]))
    r = Gmlp.Quantizer(device=dev, recipe=Gmlp.ScalingRecipe.DELAYED, amax_history_length=2,
                       fp8_format=Gmlp.Fp8Format.HYBRID, role=Gmlp.QuantizerRole.GRAD_OUTPUT)
    r.restore_state(GLib.Variant.parse(None, state.print_(True), None, None))
    assert r.save_state().equal(state)


def test_errors():
    dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0)
    x = Gmlp.GroupedTensor.new_uniform(dev, Gmlp.DType.FLOAT32, 2, 3, 4)
    x.fill_random(1, 1.0)
    e4m3 = x.convert(Gmlp.DType.FLOAT8_E4M3)
    q = Gmlp.Quantizer.new(dev, Gmlp.ScalingRecipe.CURRENT, Gmlp.Fp8Format.E4M3,
                           Gmlp.QuantizerRole.WEIGHT)
    for fn, code in [(lambda: q.quantize(e4m3), Gmlp.Error.DTYPE_MISMATCH),
                     (lambda: e4m3.dequantize(Gmlp.DType.FLOAT32), Gmlp.Error.INVALID_ARGUMENT),
                     (lambda: q.quantize(x).dequantize(Gmlp.DType.INT32), Gmlp.Error.DTYPE_MISMATCH),
                     (lambda: q.restore_state(GLib.Variant('a{sv}', {})), Gmlp.Error.INVALID_ARGUMENT)]:
        try:
            fn()
            raise AssertionError('no error')
        except GLib.Error as e:
            assert e.matches(Gmlp.error_quark(), code), e
    assert e4m3.get_scale_inv() is None
    assert e4m3.get_scaling_recipe() == Gmlp.ScalingRecipe.NONE
