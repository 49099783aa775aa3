// The gmlp-demo, shorter, in JavaScript (gjs): a student GroupedMLP learns
// a fixed random teacher; uneven routing, forward, backward and SGD.
//
//   gjs -m examples/demo.js
//
// SPDX-License-Identifier: LGPL-2.1-or-later

import Gmlp from 'gi://Gmlp?version=1.0';
import System from 'system';

const [E, H, F, T, steps, lr] = [4, 32, 48, 512, 20, 0.5];
const dev = Gmlp.Device.get_default();
const flags = Gmlp.LinearFlags.BIAS | Gmlp.LinearFlags.SINGLE_GROUPED_WEIGHT;
const teacher = Gmlp.GroupedMLP.new_full(dev, E, H, F, Gmlp.Activation.SWIGLU, Gmlp.DType.FLOAT32, flags);
const student = Gmlp.GroupedMLP.new_full(dev, E, H, F, Gmlp.Activation.SWIGLU, Gmlp.DType.FLOAT32, flags);
teacher.init_parameters(1);
student.init_parameters(2);

// A small deterministic generator for the routing.
let state = 1;
const random = () => ((state = (state * 1103515245 + 12345) % 2147483648) / 2147483648);
const losses = [];

for (let step = 1; step <= steps; step++) {
    const rows = new Array(E).fill(0);
    for (let t = 0; t < T; t++) {
        // Expert e with probability ∝ e + 1.
        let u = random() * E * (E + 1) / 2, e = 0;
        while (e < E - 1 && u >= e + 1) {
            u -= e + 1;
            e++;
        }
        rows[e]++;
    }
    const x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, rows, H);
    x.fill_random(step, 1.0);
    const [target] = teacher.forward(x);
    const [y, saved] = student.forward(x);
    y.add_scaled(-1.0, target);
    const sumSq = y.sum_squares();
    y.scale(1.0 / T);
    student.backward(saved, y);
    for (const layer of [student.get_fc1(), student.get_fc2()]) {
        layer.get_weight().add_scaled(-lr, layer.get_wgrad());
        layer.get_bias().add_scaled(-lr, layer.get_bgrad());
    }
    losses.push(sumSq / (2 * T));
    print(`step ${step}  loss ${losses[losses.length - 1].toFixed(6)}`);
}
print(`loss ${losses[0].toFixed(6)} -> ${losses[losses.length - 1].toFixed(6)}`);
System.exit(losses[losses.length - 1] < losses[0] ? 0 : 1);
