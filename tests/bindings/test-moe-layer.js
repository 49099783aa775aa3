// gjs binding test: a Gmlp.MoELayer made from properties alone, one forward
// and backward, the shapes and the routing's counts checked; bad calls
// raise Gmlp errors; the expert-parallel layer in a group of one.
//
// SPDX-License-Identifier: LGPL-2.1-or-later

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
function raises(fn, code, what) {
    let threw = false;
    try {
        fn();
    } catch (e) {
        threw = e.matches(Gmlp.error_quark(), code);
    }
    assert(threw, `${what} raises Gmlp.Error ${code}`);
}

const [T, H, F, E, K, SHARED] = [37, 16, 24, 4, 2, 8];

check('forward-backward', () => {
    const dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0);
    const layer = new Gmlp.MoELayer({
        device: dev, hidden: H, ffn_hidden: F, n_experts: E, top_k: K,
        shared_expert_ffn_hidden: SHARED, padding: 16, aux_loss_coeff: 0.01,
    });
    layer.init(null);
    layer.init_parameters(5);
    assert(layer.get_n_experts() === E && layer.get_top_k() === K, 'sizes');
    assert(layer.get_experts().get_fc1().get_n_groups() === E, 'one group per expert');
    assert(layer.get_shared_expert() !== null, 'a shared expert');

    const x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [T], H);
    x.fill_random(11, 1.0);
    const [y, saved] = layer.forward(x);
    assert(y.get_n_groups() === 1 && y.get_total_rows() === T && y.get_cols() === H, 'output shape');
    assert(new Float32Array(y.to_bytes().toArray().slice().buffer).every(Number.isFinite), 'finite output');

    const routing = layer.get_routing();
    assert(routing.get_n_tokens() === T && routing.get_top_k() === K, 'routing shape');
    const indices = new BigInt64Array(routing.get_indices().to_bytes().toArray().slice().buffer);
    assert(indices.length === T * K && indices.every(e => e >= 0n && e < BigInt(E)), 'indices in range');
    const counts = new BigInt64Array(layer.get_tokens_per_expert().to_bytes().toArray().slice().buffer);
    assert(counts.length === E && counts.reduce((a, b) => a + b, 0n) === BigInt(T * K), 'T × k choices');
    const aux = new Float32Array(layer.get_aux_loss().to_bytes().toArray().slice().buffer);
    assert(aux.length === 1 && aux[0] > 0, 'aux loss');

    const dx = layer.backward(saved, y);
    assert(saved.is_consumed(), 'consumed');
    assert(dx.get_total_rows() === T && dx.get_cols() === H, 'dx shape');
    const gate = layer.get_router().get_wgrad();
    assert(gate.get_total_rows() === E && gate.get_cols() === H, 'gate gradient');
    // The default flags: grouped weights, one gradient tensor of E members.
    const fc2 = layer.get_experts().get_fc2().get_wgrad();
    assert(fc2.get_n_groups() === E && fc2.get_cols() === F, 'experts gradient');
    assert(layer.get_shared_expert().get_fc1().get_wgrad().get_total_rows() === 2 * SHARED,
        'shared expert gradient');

    raises(() => layer.backward(saved, y), Gmlp.Error.INVALID_STATE, 'a second backward');
    raises(() => layer.forward(Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [T], H + 1)),
        Gmlp.Error.SHAPE_MISMATCH, 'the wrong width');
    raises(() => new Gmlp.MoELayer({device: dev, hidden: H, ffn_hidden: F, n_experts: E, top_k: E + 1}).init(null),
        Gmlp.Error.INVALID_ARGUMENT, 'k > n_experts');
});

// Expert parallel in a group of one (gjs has no threads for more ranks;
// tests/bindings/launch-rank.js runs processes): the same bytes as the
// one-device layer, in both modes, and an FP8 dispatch made from gjs.
check('expert-parallel', () => {
    const dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0);
    const bytes = t => new Uint8Array(t.to_bytes().toArray());
    const same = (a, b) => a.length === b.length && a.every((v, i) => v === b[i]);
    const x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [T], H);
    x.fill_random(21, 1.0);
    const one = new Gmlp.MoELayer({device: dev, hidden: H, ffn_hidden: F, n_experts: E, top_k: K});
    one.init(null);
    one.init_parameters(9);
    const [want] = one.forward(x);
    for (const mode of [Gmlp.ExpertParallelMode.EXACT, Gmlp.ExpertParallelMode.GRAPH_SAFE]) {
        const uid = Gmlp.Communicator.new_unique_id(dev);
        const comm = Gmlp.Communicator.new(dev, uid, 0, 1);
        const layer = new Gmlp.MoELayer({device: dev, communicator: comm, expert_parallel_mode: mode,
            hidden: H, ffn_hidden: F, n_experts: E, top_k: K});
        layer.init(null);
        layer.init_parameters(9);
        assert(layer.get_communicator() === comm && layer.get_n_local_experts() === E, 'local experts');
        const [y, saved] = layer.forward(x);
        assert(same(bytes(y), bytes(want)), `mode ${mode}: the one-device output`);
        const dx = layer.backward(saved, y);
        assert(dx.get_total_rows() === T, 'dx');
        // Three chunks of experts, the forward without saved activations.
        const chunked = new Gmlp.MoELayer({device: dev, communicator: comm, expert_parallel_mode: mode,
            hidden: H, ffn_hidden: F, n_experts: E, top_k: K, expert_parallel_chunks: 3});
        chunked.init(null);
        chunked.init_parameters(9);
        assert(chunked.get_expert_parallel_chunks() === 3, 'chunks');
        const yc = chunked.forward_inference(x);
        assert(same(bytes(yc), bytes(want)), `mode ${mode}: chunks, the one-device output`);
    }
    {
        // An all-to-all whose end the caller waits for (one rank: a copy).
        const uid = Gmlp.Communicator.new_unique_id(dev);
        const comm = Gmlp.Communicator.new(dev, uid, 0, 1);
        const send = Gmlp.GroupedTensor.new_from_floats(dev, Gmlp.DType.FLOAT32, [3], 2, [1, 2, 3, 4, 5, 6]);
        const recv = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [3], 2);
        const done = comm.all_to_all_rows_start(send, [3], recv, [3]);
        done.wait_on_device(dev);
        assert(same(bytes(recv), bytes(send)), 'all_to_all_rows_start');
    }
    const uid = Gmlp.Communicator.new_unique_id(dev);
    const fp8 = new Gmlp.MoELayer({device: dev, communicator: Gmlp.Communicator.new(dev, uid, 0, 1),
        hidden: H, ffn_hidden: F, n_experts: E, top_k: K,
        dispatch_fp8_recipe: Gmlp.ScalingRecipe.BLOCKWISE});
    fp8.init(null);
    assert(fp8.get_dispatch_fp8_recipe() === Gmlp.ScalingRecipe.BLOCKWISE, 'FP8 dispatch');
    raises(() => new Gmlp.MoELayer({device: dev, hidden: H, ffn_hidden: F, n_experts: E, top_k: K,
        dispatch_fp8_recipe: Gmlp.ScalingRecipe.DELAYED}).init(null),
    Gmlp.Error.UNSUPPORTED, 'a per-tensor dispatch recipe');
});

print(`1..${results.length}`);
results.forEach(([status, name, why], i) =>
    print(`${status} ${i + 1} /Gmlp/JS/moe-layer/${name}${why ? ` # ${why}` : ''}`));
System.exit(results.every(r => r[0] === 'ok') ? 0 : 1);
