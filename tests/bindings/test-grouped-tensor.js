// gjs binding test: a grouped tensor built from bytes and read back.
//
// SPDX-License-Identifier: LGPL-2.1-or-later

import GLib from 'gi://GLib';
import Gmlp from 'gi://Gmlp?version=1.0';
import System from 'system';

const results = [];
function check(name, fn) {
    try {
        fn();
        results.push(['ok', name, '']);
    } catch (e) {
        results.push(['not ok', name, String(e)]);
    }
}
function assert(cond, what) {
    if (!cond)
        throw new Error(`assertion failed: ${what}`);
}

check('round-trip', () => {
    const dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0);
    const rows = [3, 0, 5, 1];
    const cols = 7;
    const n = rows.reduce((a, b) => a + b) * cols;
    const values = new Float32Array(n);
    for (let i = 0; i < n; i++)
        values[i] = (Math.random() - 0.5) * 10;
    const data = new Uint8Array(values.buffer);
    const t = Gmlp.GroupedTensor.new_from_bytes(dev, Gmlp.DType.FLOAT32, rows, cols,
        new GLib.Bytes(data));
    assert(t.get_n_groups() === 4, 'n_groups');
    assert(t.get_total_rows() === 9, 'total rows');
    assert(t.get_member_offset(2) % 256 === 0, 'alignment');
    const out = t.to_bytes().toArray();
    assert(out.length === data.length, 'length');
    for (let i = 0; i < data.length; i++)
        assert(out[i] === data[i], `byte ${i}`);
    const member = t.get_member(2);
    const back = new Float32Array(member.to_bytes().toArray().buffer);
    for (let i = 0; i < 5 * cols; i++)
        assert(back[i] === values[3 * cols + i], `member value ${i}`);
});

check('errors', () => {
    const dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0);
    let threw = false;
    try {
        Gmlp.GroupedTensor.new_from_bytes(dev, Gmlp.DType.FLOAT32, [2], 0,
            new GLib.Bytes(new Uint8Array(0)));
    } catch (e) {
        threw = e.matches(Gmlp.error_quark(), Gmlp.Error.INVALID_ARGUMENT);
    }
    assert(threw, 'cols = 0 raises INVALID_ARGUMENT');
});

check('grouped-linear', () => {
    const dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0);
    const rows = [2, 3];
    const x = Gmlp.GroupedTensor.new_from_bytes(dev, Gmlp.DType.FLOAT32, rows, 4,
        new GLib.Bytes(new Uint8Array(new Float32Array(20).fill(1).buffer)));
    const layer = Gmlp.GroupedLinear.new(dev, 2, 4, 8);
    let events = 0;
    layer.connect('wgrad-ready', (_layer, event) => {
        events += event.synchronize() ? 1 : 0;
    });
    const [y, saved] = layer.forward(x);
    assert(y.get_cols() === 8 && y.get_total_rows() === 5, 'output shape');
    const dx = layer.backward(saved, y);
    assert(dx.get_cols() === 4, 'dgrad shape');
    assert(saved.is_consumed(), 'consumed');
    assert(events === 1, 'wgrad-ready once');
    assert(layer.get_wgrad().get_n_groups() === 2, 'wgrad');
});

// Objects made the gjs way, from properties alone, are complete; bad or
// missing properties give errors, not crashes.
check('property-constructors', () => {
    const dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0);
    const layer = new Gmlp.GroupedLinear({device: dev, n_groups: 2, in_features: 4, out_features: 8});
    const x = new Gmlp.GroupedTensor({device: dev, rows: new GLib.Variant('ax', [2, 3]), cols: 4});
    x.fill_random(7, 1.0);
    const [y] = layer.forward(x);
    assert(y.get_total_rows() === 5 && y.get_cols() === 8, 'output shape');
    const values = new Float32Array(y.to_bytes().toArray().buffer);
    assert(values.every(Number.isFinite), 'finite output');

    for (const make of [() => new Gmlp.GroupedTensor().fill_zero(),
        () => new Gmlp.GroupedLinear({device: dev, n_groups: 0}).forward(x),
        () => new Gmlp.GroupedMLP({device: dev, hidden: -1}).init(null),
        () => new Gmlp.Graph().replay()]) {
        let threw = false;
        try {
            make();
        } catch (e) {
            threw = e.matches(Gmlp.error_quark(), e.code);
        }
        assert(threw, `${make} raises a Gmlp.Error`);
    }
    assert(new Gmlp.Device({kind: Gmlp.DeviceKind.CPU}) === dev, 'one Device per device');
});

print(`1..${results.length}`);
results.forEach(([status, name, why], i) =>
    print(`${status} ${i + 1} /Gmlp/JS/${name}${why ? ` # ${why}` : ''}`));
System.exit(results.every(r => r[0] === 'ok') ? 0 : 1);
