// The gmlp-demo, shorter, in JavaScript (gjs): a student MoE layer learns a
// fixed teacher MoE layer, router included (see examples/demo.py); the exit
// status says whether the loss fell and the routing agreement rose.
//
//   gjs -m examples/demo.js
//
// SPDX-License-Identifier: LGPL-2.1-or-later

import GLib from 'gi://GLib';
import Gmlp from 'gi://Gmlp?version=1.0';
import System from 'system';

const [E, K, H, F, T, steps] = [8, 2, 32, 48, 512, 20];
const [LR, LR_ROUTER, NOISE] = [0.5, 50.0, 0.5];
const flags = Gmlp.LinearFlags.BIAS | Gmlp.LinearFlags.SINGLE_GROUPED_WEIGHT;

function makeLayer(dev, extra = {}) {
    const layer = new Gmlp.MoELayer({
        device: dev, hidden: H, ffn_hidden: F, n_experts: E, top_k: K,
        dtype: Gmlp.DType.FLOAT32, flags, ...extra,
    });
    layer.init(null);   // throws what construction found
    return layer;
}
const int64s = t => new BigInt64Array(t.to_bytes().toArray().slice().buffer);

// The MoE layer is on the CPU only for now: a device chosen by default falls
// back to the CPU; one named in GMLP_DEVICE is an error (as gmlp-demo).
let dev = Gmlp.Device.get_default();
let teacher;
try {
    teacher = makeLayer(dev);
} catch (e) {
    if (!e.matches?.(Gmlp.error_quark(), Gmlp.Error.UNSUPPORTED) || GLib.getenv('GMLP_DEVICE'))
        throw e;
    print(`notice: the MoE layer does not run on ${dev.get_name()} yet; training on the CPU`);
    dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0);
    teacher = makeLayer(dev);
}
const student = makeLayer(dev, {aux_loss_coeff: 0.01});
teacher.init_parameters(1);
student.init_parameters(2);

// A small deterministic generator; normal draws by Box-Muller.
let state = 1;
const random = () => ((state = (state * 1103515245 + 12345) % 2147483648) + 1) / 2147483649;
const gauss = () => Math.sqrt(-2 * Math.log(random())) * Math.cos(2 * Math.PI * random());

// The teacher's gate: confident, expert e's row scaled by 0.5 + e / (E - 1).
const gate = Float32Array.from({length: E * H},
    (_, i) => gauss() * 2 / Math.sqrt(H) * (0.5 + Math.floor(i / H) / (E - 1)));
teacher.get_router().set_weight_from_bytes(new GLib.Bytes(new Uint8Array(gate.buffer)));
// The student's experts: the teacher's plus half a fresh draw.
for (const [s, t] of [[student.get_experts().get_fc1(), teacher.get_experts().get_fc1()],
    [student.get_experts().get_fc2(), teacher.get_experts().get_fc2()]]) {
    for (const [ps, pt] of [[s.get_weight(), t.get_weight()], [s.get_bias(), t.get_bias()]]) {
        ps.scale(NOISE);
        ps.add_scaled(1.0, pt);
    }
}

const x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [T], H);
const [losses, agreements] = [[], []];
for (let step = 1; step <= steps; step++) {
    x.fill_random(step, 1.0);
    const [target] = teacher.forward(x);
    const [y, saved] = student.forward(x);
    y.add_scaled(-1.0, target);
    const loss = y.sum_squares() / (2 * T);
    y.scale(1.0 / T);
    student.backward(saved, y);
    for (const fc of [student.get_experts().get_fc1(), student.get_experts().get_fc2()]) {
        fc.get_weight().add_scaled(-LR, fc.get_wgrad());
        fc.get_bias().add_scaled(-LR, fc.get_bgrad());
    }
    const router = student.get_router();
    router.get_weight().add_scaled(-LR_ROUTER, router.get_wgrad());

    const chosenT = int64s(teacher.get_routing().get_indices());
    const chosenS = int64s(student.get_routing().get_indices());
    let same = 0;
    for (let t = 0; t < T; t++) {
        const mine = chosenS.slice(t * K, (t + 1) * K);
        for (const e of chosenT.slice(t * K, (t + 1) * K))
            same += mine.includes(e) ? 1 : 0;
    }
    const load = Array.from(int64s(student.get_tokens_per_expert()), Number);
    const aux = new Float32Array(student.get_aux_loss().to_bytes().toArray().slice().buffer)[0];
    losses.push(loss);
    agreements.push(same / (T * K));
    print(`step ${step}  loss ${loss.toFixed(6)}  aux ${aux.toFixed(6)}  ` +
          `agree ${agreements[step - 1].toFixed(3)}  load ${Math.min(...load)}-${Math.max(...load)}`);
}

const q = Math.max(Math.floor(steps / 4), 1);
const mean = a => a.reduce((s, v) => s + v, 0) / a.length;
const [first, last] = [mean(losses.slice(0, q)), mean(losses.slice(-q))];
const rise = mean(agreements.slice(-q)) - mean(agreements.slice(0, q));
print(`loss ${first.toFixed(6)} -> ${last.toFixed(6)}, routing agreement ${rise >= 0 ? '+' : ''}${rise.toFixed(3)}`);
System.exit(last <= 0.7 * first && rise >= 0.1 ? 0 : 1);
