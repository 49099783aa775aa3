#!/usr/bin/python3
# Python binding test: an expert-parallel Gmlp.MoELayer from Python
# threads, one rank per thread on a CPU device of its own (cpu:0, cpu:1,
# ...), in both modes, against one-device layers with the same seed: each
# rank's output and input gradient are its one-device layer's on its
# tokens, each local expert's weight gradient the sum over the ranks' of
# that expert's. Ranks that disagree raise GLib.Error on every rank. An FP8
# dispatch of tokens it carries exactly gives the plain layer's output.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os

import numpy as np
import pytest

import gi

gi.require_version('Gmlp', '1.0')
from gi.repository import GLib, Gmlp  # noqa: E402

from gmlp_ranks import run_group  # noqa: E402

rng = np.random.default_rng(int(os.environ.get('GMLP_TEST_SEED', np.random.SeedSequence().entropy % (1 << 32))))
F32 = Gmlp.DType.FLOAT32
H, F, K = 8, 12, 2
TOL = 1e-5   # FP32; the experts' sums go in another order (tests/test-moe-expert-parallel.c)


def upload(dev, array):
    array = np.ascontiguousarray(array, dtype=np.float32)
    return Gmlp.GroupedTensor.new_from_bytes(dev, F32, [array.shape[0]], array.shape[1],
                                             GLib.Bytes.new(array.tobytes()))


def download(tensor):
    return np.frombuffer(tensor.to_bytes().get_data(), dtype=np.float32).astype(np.float64)


def close(got, want):
    assert np.all(np.isfinite(got))
    assert np.linalg.norm(got - want) <= TOL * np.linalg.norm(want)


@pytest.mark.parametrize('mode', [Gmlp.ExpertParallelMode.EXACT, Gmlp.ExpertParallelMode.GRAPH_SAFE])
@pytest.mark.parametrize('world', [2, 3])
def test_equals_one_device(world, mode):
    E, tokens, seed = 2 * world, 16, int(rng.integers(1 << 31))
    xs = [rng.standard_normal((tokens, H)) for _ in range(world)]
    dys = [rng.standard_normal((tokens, H)) for _ in range(world)]

    def step(layer, dev, r):
        y, saved = layer.forward(upload(dev, xs[r]))
        dx = layer.backward(saved, upload(dev, dys[r]))
        experts = layer.get_experts()
        return (download(y), download(dx), download(experts.get_fc1().get_wgrad()),
                download(experts.get_fc2().get_wgrad()))

    def body(comm, r):
        dev = comm.get_device()
        ep = Gmlp.MoELayer(device=dev, communicator=comm, expert_parallel_mode=mode, hidden=H,
                           ffn_hidden=F, n_experts=E, top_k=K)
        ep.init(None)
        ref = Gmlp.MoELayer(device=dev, hidden=H, ffn_hidden=F, n_experts=E, top_k=K)
        ref.init(None)
        assert ep.get_n_local_experts() == 2 and ep.get_first_local_expert() == 2 * r
        assert ep.props.communicator == comm and ep.props.expert_parallel_mode == mode
        ep.init_parameters(seed)
        ref.init_parameters(seed)
        got = step(ep, dev, r)
        if mode == Gmlp.ExpertParallelMode.GRAPH_SAFE:
            dropped = np.frombuffer(ep.get_dropped_rows().to_bytes().get_data(), dtype=np.int64)
            assert dropped.tolist() == [0]
        return got, step(ref, dev, r)

    results = run_group(world, body)
    for r, (got, want) in enumerate(results):
        close(got[0], want[0])
        close(got[1], want[1])
        for i in (2, 3):
            per = want[i].size // E
            total = sum(results[a][1][i] for a in range(world))
            close(got[i], total[per * 2 * r:per * 2 * (r + 1)])


def fp8_exact(tokens):
    # E4M3 values times 2^-8, a ±448 in every row: an FP8 dispatch of either
    # recipe carries them exactly (scale 2^8), so it must equal the plain layer.
    v = (1 + rng.integers(0, 8, (tokens, H)) / 8) * 2.0 ** rng.integers(-2, 8, (tokens, H))
    v[:, 0] = 448
    return np.where(rng.integers(0, 2, (tokens, H)) == 1, -v, v) * 2.0 ** -8


@pytest.mark.parametrize('recipe', [Gmlp.ScalingRecipe.BLOCKWISE, Gmlp.ScalingRecipe.MXFP8])
@pytest.mark.parametrize('mode', [Gmlp.ExpertParallelMode.EXACT, Gmlp.ExpertParallelMode.GRAPH_SAFE])
def test_fp8_dispatch(mode, recipe):
    world, tokens, seed = 2, 16, int(rng.integers(1 << 31))
    xs = [fp8_exact(tokens) for _ in range(world)]

    def body(comm, r):
        dev = comm.get_device()
        layers = []
        for fp8 in (recipe, Gmlp.ScalingRecipe.NONE):
            layer = Gmlp.MoELayer(device=dev, communicator=comm, expert_parallel_mode=mode, hidden=H,
                                  ffn_hidden=F, n_experts=2 * world, top_k=K, dispatch_fp8_recipe=fp8)
            layer.init(None)
            layer.init_parameters(seed)
            layers.append(layer)
        assert layers[0].get_dispatch_fp8_recipe() == recipe
        assert layers[0].props.dispatch_fp8_format == Gmlp.Fp8Format.E4M3
        return [download(layer.forward(upload(dev, xs[r]))[0]) for layer in layers]

    for got, want in run_group(world, body):
        close(got, want)


def test_fp8_dispatch_refused():
    def body(comm, r):
        layer = Gmlp.MoELayer(device=comm.get_device(), communicator=comm, hidden=H, ffn_hidden=F,
                              n_experts=4, top_k=K, dispatch_fp8_recipe=Gmlp.ScalingRecipe.DELAYED)
        with pytest.raises(GLib.Error) as info:
            layer.init(None)
        return info.value

    for error in run_group(2, body):
        assert error.matches(Gmlp.error_quark(), Gmlp.Error.UNSUPPORTED)


def test_ranks_disagree():
    def body(comm, r):
        layer = Gmlp.MoELayer(device=comm.get_device(), communicator=comm, hidden=H + 4 * r,
                              ffn_hidden=F, n_experts=4, top_k=K)
        with pytest.raises(GLib.Error) as info:
            layer.init(None)
        return info.value

    for error in run_group(2, body):
        assert error.matches(Gmlp.error_quark(), Gmlp.Error.SHAPE_MISMATCH)
        assert 'hidden' in error.message


@pytest.mark.parametrize('mode', [Gmlp.ExpertParallelMode.EXACT, Gmlp.ExpertParallelMode.GRAPH_SAFE])
@pytest.mark.parametrize('world', [2, 3])
def test_chunks(world, mode):
    # expert-parallel-chunks pipelines a forward without saved activations
    # by chunks of whole local experts: the same bits as one chunk, for any
    # count (more than the local experts too); with a shared expert, which
    # runs while the dispatch is in flight.
    L, tokens, seed = 4, 12, int(rng.integers(1 << 31))
    xs = [rng.standard_normal((tokens, H)) for _ in range(world)]
    dys = [rng.standard_normal((tokens, H)) for _ in range(world)]

    def body(comm, r):
        dev = comm.get_device()
        out = []
        for chunks in (1, 3, 100):
            layer = Gmlp.MoELayer(device=dev, communicator=comm, expert_parallel_mode=mode, hidden=H,
                                  ffn_hidden=F, n_experts=L * world, top_k=K,
                                  shared_expert_ffn_hidden=6, expert_parallel_chunks=chunks)
            layer.init(None)
            assert layer.get_expert_parallel_chunks() == chunks
            layer.init_parameters(seed)
            inference = download(layer.forward_inference(upload(dev, xs[r])))
            y, saved = layer.forward(upload(dev, xs[r]))
            dx = layer.backward(saved, upload(dev, dys[r]))
            out.append((inference, download(y), download(dx),
                        download(layer.get_experts().get_fc1().get_wgrad()),
                        download(layer.get_shared_expert().get_fc2().get_wgrad())))
        return out

    for runs in run_group(world, body):
        for run in runs:
            assert np.array_equal(run[0], runs[0][1])   # pipelined == saved forward
            for got, want in zip(run, runs[0]):
                assert np.array_equal(got, want)


@pytest.mark.parametrize('mode', [Gmlp.ExpertParallelMode.EXACT, Gmlp.ExpertParallelMode.GRAPH_SAFE])
@pytest.mark.parametrize('world', [2, 4])
def test_chunks_training(world, mode):
    # A training step by chunks (forward that saves, backward, backward_dw)
    # keeps the gradient contract of one backward: with fused main_grad and
    # delayed weight gradients, none before backward_dw, one pending,
    # wgrad-ready once after it, and the same bits as one chunk; an expert
    # without rows (one token per rank) left as it was.
    L, tokens, seed = 3, 2, int(rng.integers(1 << 31))
    flags = (Gmlp.LinearFlags.SINGLE_GROUPED_WEIGHT | Gmlp.LinearFlags.FUSE_WGRAD_ACCUMULATION |
             Gmlp.LinearFlags.DELAY_WGRAD_COMPUTE)
    xs = [rng.standard_normal((tokens, H)) for _ in range(world)]
    dys = [rng.standard_normal((tokens, H)) for _ in range(world)]

    def body(comm, r):
        dev = comm.get_device()
        out = []
        for chunks in (1, 2, 100):
            layer = Gmlp.MoELayer(device=dev, communicator=comm, expert_parallel_mode=mode, hidden=H,
                                  ffn_hidden=F, n_experts=L * world, top_k=1, flags=flags,
                                  expert_capacity_factor=1.0, expert_parallel_chunks=chunks)
            layer.init(None)
            layer.init_parameters(seed)
            experts = layer.get_experts()
            ready = []
            experts.connect('wgrad-ready', lambda _mlp, event: ready.append(event.synchronize()))
            y, saved = layer.forward(upload(dev, xs[r]))
            dx = layer.backward(saved, upload(dev, dys[r]))
            assert ready == []
            assert experts.get_fc1().get_pending_wgrads() == 1 == experts.get_fc2().get_pending_wgrads()
            layer.backward_dw()
            assert len(ready) == 1
            assert experts.get_fc1().get_pending_wgrads() == 0
            out.append((download(y), download(dx), download(experts.get_fc1().get_main_grad()),
                        download(experts.get_fc2().get_main_grad())))
        return out

    for runs in run_group(world, body):
        for run in runs:
            for got, want in zip(run, runs[0]):
                assert np.array_equal(got, want)


def test_chunks_default():
    dev = Gmlp.Device.new_from_string('cpu')
    layer = Gmlp.MoELayer(device=dev, hidden=H, ffn_hidden=F, n_experts=4, top_k=K)
    assert layer.props.expert_parallel_chunks == 4 == layer.get_expert_parallel_chunks()
