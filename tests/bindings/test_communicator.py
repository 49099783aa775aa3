#!/usr/bin/python3
# Python binding test: Gmlp.Communicator from Python threads, one rank per
# thread on a CPU device of its own (cpu:0, cpu:1, ...): all-reduce, all-
# gather and both all-to-alls against numpy references from fresh random
# inputs; bad input and a rank that aborts raise GLib.Error.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os
import time

import numpy as np
import pytest

import gi

gi.require_version('Gmlp', '1.0')
from gi.repository import GLib, Gmlp  # noqa: E402

from gmlp_ranks import run_group  # noqa: E402

rng = np.random.default_rng(int(os.environ.get('GMLP_TEST_SEED', np.random.SeedSequence().entropy % (1 << 32))))
F32 = Gmlp.DType.FLOAT32


def upload(dev, array, rows):
    array = np.ascontiguousarray(array, dtype=np.float32)
    return Gmlp.GroupedTensor.new_from_bytes(dev, F32, list(rows), array.shape[1],
                                             GLib.Bytes.new(array.tobytes()))


def poisoned(dev, rows, cols):
    return upload(dev, np.full((sum(rows), cols), np.nan, np.float32), rows)


def download(tensor, cols):
    return np.frombuffer(tensor.to_bytes().get_data(), dtype=np.float32).reshape(-1, cols).copy()


@pytest.mark.parametrize('world', [2, 3, 4])
def test_all_reduce(world):
    rows, cols = [3, 0, 2], 5
    inputs = [rng.standard_normal((sum(rows), cols)).astype(np.float32) for _ in range(world)]

    def body(comm, r):
        dev = comm.get_device()
        x, y = upload(dev, inputs[r], rows), upload(dev, inputs[r], rows)
        comm.all_reduce(x, Gmlp.ReduceOp.SUM)
        comm.all_reduce(y, Gmlp.ReduceOp.AVERAGE)
        return download(x, cols), download(y, cols)

    results = run_group(world, body)
    want = np.sum([a.astype(np.float64) for a in inputs], axis=0)
    for got_sum, got_avg in results:
        np.testing.assert_allclose(got_sum, want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got_avg, want / world, rtol=1e-6, atol=1e-6)
        assert np.array_equal(got_sum, results[0][0])


@pytest.mark.parametrize('world', [2, 3])
def test_all_gather_and_all_to_all(world):
    cols = 4
    rows = [int(n) for n in rng.integers(0, 4, 2)]
    inputs = [rng.standard_normal((sum(rows), cols)).astype(np.float32) for _ in range(world)]
    # counts[p][q]: rows from rank p to rank q
    counts = rng.integers(0, 4, (world, world))
    rows_in = [rng.standard_normal((int(counts[p].sum()), cols)).astype(np.float32) for p in range(world)]

    def body(comm, r):
        dev = comm.get_device()
        gathered = poisoned(dev, rows * world, cols)
        comm.all_gather(upload(dev, inputs[r], rows), gathered)
        # by members: member q of rank r's send goes to rank q
        send = upload(dev, rows_in[r], [int(c) for c in counts[r]])
        recv = poisoned(dev, [int(counts[p][r]) for p in range(world)], cols)
        comm.all_to_all(send, recv)
        # by rows on the host, one matrix each
        recv_rows = poisoned(dev, [int(counts[:, r].sum())], cols)
        comm.all_to_all_rows(upload(dev, rows_in[r], [int(counts[r].sum())]),
                             [int(c) for c in counts[r]], recv_rows,
                             [int(counts[p][r]) for p in range(world)])
        return download(gathered, cols), download(recv, cols), download(recv_rows, cols)

    results = run_group(world, body)
    for r, (gathered, recv, recv_rows) in enumerate(results):
        assert np.array_equal(gathered, np.concatenate(inputs))
        starts = [np.concatenate([[0], np.cumsum(counts[p])]) for p in range(world)]
        want = np.concatenate([rows_in[p][starts[p][r]:starts[p][r + 1]] for p in range(world)])
        assert np.array_equal(recv, want)
        assert np.array_equal(recv_rows, want)


@pytest.mark.parametrize('world', [2, 3])
def test_all_to_all_start(world):
    # The all-to-alls whose end the caller waits for: the device's stream
    # goes on until it waits on the event, which keeps send alive.
    cols = 4
    counts = rng.integers(0, 4, (world, world))
    rows_in = [rng.standard_normal((int(counts[p].sum()), cols)).astype(np.float32) for p in range(world)]

    def body(comm, r):
        dev = comm.get_device()
        recv = poisoned(dev, [int(counts[p][r]) for p in range(world)], cols)
        done = comm.all_to_all_start(upload(dev, rows_in[r], [int(c) for c in counts[r]]), recv)
        assert isinstance(done, Gmlp.Event)
        done.wait_on_device(dev)
        recv_rows = poisoned(dev, [int(counts[:, r].sum())], cols)
        done = comm.all_to_all_rows_start(upload(dev, rows_in[r], [int(counts[r].sum())]),
                                          [int(c) for c in counts[r]], recv_rows,
                                          [int(counts[p][r]) for p in range(world)])
        done.wait_on_device(dev)
        done.synchronize()
        return download(recv, cols), download(recv_rows, cols)

    results = run_group(world, body)
    for r, (recv, recv_rows) in enumerate(results):
        starts = [np.concatenate([[0], np.cumsum(counts[p])]) for p in range(world)]
        want = np.concatenate([rows_in[p][starts[p][r]:starts[p][r + 1]] for p in range(world)])
        assert np.array_equal(recv, want)
        assert np.array_equal(recv_rows, want)


def test_bad_input():
    dev = Gmlp.Device.new_from_string('cpu:1')
    comm = Gmlp.Communicator.new(dev, Gmlp.Communicator.new_unique_id(dev), 0, 1)
    assert (comm.get_rank(), comm.get_world_size(), comm.props.timeout_ms) == (0, 1, 600000)
    recv = poisoned(dev, [2], 4)
    with pytest.raises(GLib.Error) as e:
        comm.all_gather(upload(dev, np.zeros((2, 3)), [2]), recv)
    assert e.value.matches(Gmlp.error_quark(), Gmlp.Error.SHAPE_MISMATCH)
    with pytest.raises(GLib.Error) as e:
        comm.all_reduce(upload(Gmlp.Device.new_from_string('cpu:2'), np.zeros((2, 4)), [2]),
                        Gmlp.ReduceOp.SUM)
    assert e.value.matches(Gmlp.error_quark(), Gmlp.Error.INVALID_ARGUMENT)
    with pytest.raises(GLib.Error) as e:
        comm.all_to_all_rows(recv, [1, 1], poisoned(dev, [2], 4), [2])
    assert e.value.matches(Gmlp.error_quark(), Gmlp.Error.INVALID_ARGUMENT)
    assert np.all(np.isnan(download(recv, 4)))
    with pytest.raises(GLib.Error) as e:
        Gmlp.Communicator.new(dev, GLib.Bytes.new(b'not an id'), 0, 1)
    assert e.value.matches(Gmlp.error_quark(), Gmlp.Error.INVALID_ARGUMENT)


def test_abort():
    world = 3

    def body(comm, r):
        dev = comm.get_device()
        x = upload(dev, np.ones((2, 4)), [2])
        if r == world - 1:
            time.sleep(0.05)
            comm.abort()
            return None
        start = time.monotonic()
        with pytest.raises(GLib.Error) as e:
            comm.all_reduce(x, Gmlp.ReduceOp.SUM)
        assert e.value.matches(Gmlp.error_quark(), Gmlp.Error.ABORTED)
        assert 'aborted' in e.value.message
        return time.monotonic() - start

    for elapsed in run_group(world, body, timeout_ms=30000)[:-1]:
        assert elapsed < 10
