// gjs binding test: typed arrays in and out of grouped tensors with no
// GLib.Bytes (new_from_floats, new_from_ints, new_from_uint16 and their
// readers), values against references computed here from random inputs.
//
// SPDX-License-Identifier: LGPL-2.1-or-later

import GLib from 'gi://GLib';
import Gmlp from 'gi://Gmlp?version=1.0';
import {assert, check, finish} from './tap.js';

function throws(code, fn, what) {
    let threw = false;
    try {
        fn();
    } catch (e) {
        threw = e instanceof GLib.Error && e.matches(Gmlp.error_quark(), code);
    }
    assert(threw, `${what} raises the Gmlp.Error`);
}

// The bits of round-to-nearest-even to bfloat16 of a float32.
function bf16Bits(x) {
    const u = new Uint32Array(new Float32Array([x]).buffer)[0];
    return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}
function bf16Value(bits) {
    return new Float32Array(new Uint32Array([bits << 16]).buffer)[0];
}

const dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0);

// The example: three floats, not three bytes.
check('float32array', () => {
    const values = new Float32Array([1.5, 300.7, -2.0]);
    const t = Gmlp.GroupedTensor.new_from_floats(dev, Gmlp.DType.FLOAT32, [1, 2], 1, values);
    assert(t.get_total_rows() === 3, 'three rows');
    const back = t.to_floats();
    assert(back.length === 3, 'three values back');
    for (let i = 0; i < 3; i++)
        assert(back[i] === values[i], `value ${i}: ${back[i]} vs ${values[i]}`);
});

check('random-floats', () => {
    const rows = [3, 0, 5, 1];
    const cols = 7;
    const n = 9 * cols;
    const values = new Float32Array(n);
    for (let i = 0; i < n; i++)
        values[i] = (Math.random() - 0.5) * 1000;
    const f = Gmlp.GroupedTensor.new_from_floats(dev, Gmlp.DType.FLOAT32, rows, cols, values);
    const b = Gmlp.GroupedTensor.new_from_floats(dev, Gmlp.DType.BFLOAT16, rows, cols, values);
    const fb = f.to_floats(), bb = b.to_floats(), bits = b.to_uint16();
    assert(fb.length === n && bb.length === n && bits.length === n, 'lengths');
    for (let i = 0; i < n; i++) {
        assert(fb[i] === values[i], `float32 value ${i}`);
        assert(bits[i] === bf16Bits(values[i]), `bfloat16 bits ${i}`);
        assert(bb[i] === bf16Value(bf16Bits(values[i])), `bfloat16 value ${i}`);
    }
    // A plain array of numbers goes in too.
    const plain = Gmlp.GroupedTensor.new_from_floats(dev, Gmlp.DType.FLOAT32, rows, cols,
        Array.from(values));
    assert(plain.to_floats().every((v, i) => v === values[i]), 'plain array');
});

check('uint16array', () => {
    const n = 4 * 128;
    const bits = new Uint16Array(n);
    for (let i = 0; i < n; i++)
        bits[i] = bf16Bits((Math.random() - 0.5) * 8);
    const t = Gmlp.GroupedTensor.new_from_uint16(dev, Gmlp.DType.BFLOAT16, [1, 3], 128, bits);
    const back = t.to_uint16(), wide = t.to_floats();
    for (let i = 0; i < n; i++) {
        assert(back[i] === bits[i], `bits ${i}`);
        assert(wide[i] === bf16Value(bits[i]), `widened ${i}`);
    }
});

check('ints', () => {
    const sizes = Gmlp.GroupedTensor.new_from_ints(dev, Gmlp.DType.INT64, [3], 1, [4, 0, 2]);
    const back = sizes.to_ints();
    assert(back.length === 3 && back[0] === 4 && back[1] === 0 && back[2] === 2, 'sizes back');
    const t = Gmlp.GroupedTensor.new_with_device_sizes(dev, Gmlp.DType.FLOAT32, sizes, 10, 8);
    t.fill_zero();
    assert(t.to_floats().length === 6 * 8, 'device-sized tensor reads its rows');
    const i32 = Gmlp.GroupedTensor.new_from_ints(dev, Gmlp.DType.INT32, [2], 2,
        new Int32Array([-7, 2147483647, -2147483648, 0]));
    assert(i32.to_ints().join() === '-7,2147483647,-2147483648,0', 'int32 back');
});

check('errors', () => {
    throws(Gmlp.Error.INVALID_ARGUMENT, () => Gmlp.GroupedTensor.new_from_floats(dev,
        Gmlp.DType.FLOAT32, [2], 2, new Float32Array(3)), 'a short array');
    throws(Gmlp.Error.DTYPE_MISMATCH, () => Gmlp.GroupedTensor.new_from_floats(dev,
        Gmlp.DType.INT64, [1], 1, [1]), 'floats into INT64');
    throws(Gmlp.Error.DTYPE_MISMATCH, () => Gmlp.GroupedTensor.new_from_uint16(dev,
        Gmlp.DType.FLOAT32, [1], 1, new Uint16Array(1)), 'uint16 into FLOAT32');
    const f = Gmlp.GroupedTensor.new_from_floats(dev, Gmlp.DType.FLOAT32, [1], 1, [1]);
    throws(Gmlp.Error.UNSUPPORTED, () => f.to_ints(), 'floats read as ints');
});

finish('/Gmlp/JS/TypedArrays/');
