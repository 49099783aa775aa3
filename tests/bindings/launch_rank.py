#!/usr/bin/python3
# One rank of a group started by gmlp-launch (the test python-launch runs
# `gmlp-launch -n 3 --devices cpu --tag python3 launch_rank.py SEED`): joins
# with Gmlp.Communicator.new_from_launcher(), all-reduces, all-gathers and
# exchanges (all_to_all_rows) numpy data that every rank draws from the same
# seed, against numpy references; outside the launcher's variables the
# constructor raises GLib.Error naming the one missing. Exits non-zero on
# any failure (an exception), which the launcher reports.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os
import sys

import numpy as np

import gi
import gi.overrides

if os.environ.get('GMLP_OVERRIDES_DIR'):
    gi.overrides.__path__.insert(0, os.environ['GMLP_OVERRIDES_DIR'])
gi.require_version('Gmlp', '1.0')
from gi.repository import GLib, Gmlp  # noqa: E402

seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
F32 = Gmlp.DType.FLOAT32

# Without GMLP_RANK: INVALID_STATE naming it.
saved = os.environ.pop('GMLP_RANK')
try:
    Gmlp.Communicator.new_from_launcher()
    raise AssertionError('new_from_launcher() without GMLP_RANK succeeded')
except GLib.Error as e:
    assert e.matches(Gmlp.error_quark(), Gmlp.Error.INVALID_STATE), e
    assert 'GMLP_RANK' in e.message, e.message
os.environ['GMLP_RANK'] = saved

comm = Gmlp.Communicator.new_from_launcher()
rank, world = comm.get_rank(), comm.get_world_size()
dev = comm.get_device()
assert dev == Gmlp.Device.get_default()
assert dev.get_ordinal() == rank, dev.get_name()


def inputs(r, call, shape):
    return np.random.default_rng([seed, r, call]).standard_normal(shape).astype(np.float32)


def upload(array, rows):
    array = np.ascontiguousarray(array, dtype=np.float32)
    return Gmlp.GroupedTensor.new_from_bytes(dev, F32, list(rows), array.shape[1],
                                             GLib.Bytes.new(array.tobytes()))


def download(tensor, cols):
    return np.frombuffer(tensor.to_bytes().get_data(), dtype=np.float32).reshape(-1, cols)


# all_reduce (sum and average): the float64 sum in rank order, rounded once
for call, op in ((1, Gmlp.ReduceOp.SUM), (2, Gmlp.ReduceOp.AVERAGE)):
    x = upload(inputs(rank, call, (11, 4)), [11])
    comm.all_reduce(x, op)
    want = sum(inputs(r, call, (11, 4)).astype(np.float64) for r in range(world))
    if op == Gmlp.ReduceOp.AVERAGE:
        want /= world
    np.testing.assert_array_equal(download(x, 4), want.astype(np.float32))

# all_gather
send = upload(inputs(rank, 3, (5, 3)), [2, 3])
recv = upload(np.full((5 * world, 3), np.nan), [2, 3] * world)
comm.all_gather(send, recv)
np.testing.assert_array_equal(download(recv, 3),
                              np.concatenate([inputs(r, 3, (5, 3)) for r in range(world)]))


# all_to_all_rows: counts[p][q] rows from p to q
def counts(call):
    return np.random.default_rng([seed, 99, call]).integers(0, 5, (world, world))


c = counts(4)
send = upload(inputs(rank, 4, (c[rank].sum(), 2)), [c[rank].sum()])
recv = upload(np.full((c[:, rank].sum(), 2), np.nan), [c[:, rank].sum()])
comm.all_to_all_rows(send, list(c[rank]), recv, list(c[:, rank]))
want = [inputs(p, 4, (c[p].sum(), 2))[c[p, :rank].sum():c[p, :rank + 1].sum()] for p in range(world)]
np.testing.assert_array_equal(download(recv, 2), np.concatenate(want))

print('rank %d of %d: ok' % (rank, world))
