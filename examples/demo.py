#!/usr/bin/python3
# The gmlp-demo, shorter, in Python: a student MoE layer learns a fixed
# teacher MoE layer, router included. The teacher's gate is confident and
# uneven; the student starts from the teacher's experts plus noise and a
# gate of its own, and learns by SGD on every parameter. Each step prints
# the loss, the aux loss, the routing agreement (the share of the teacher's
# choices the student makes too), tokens/s and the fewest and most tokens
# per expert; the exit status says whether the loss fell and the agreement
# rose (gmlp-demo --check's rule).
#
#   /usr/bin/python3 examples/demo.py [STEPS] [--experts N]
#   gmlp-launch -n W /usr/bin/python3 examples/demo.py [STEPS] [--experts N] --ep
#       [--ep-mode exact|graph-safe] [--ep-capacity F]
#
# --ep trains expert-parallel as gmlp-demo --ep does: one rank a process,
# started by gmlp-launch, each on the device the launcher gives it, joined
# by Gmlp.Communicator.new_from_launcher(). Rank r holds experts
# r·E/W .. (r+1)·E/W - 1 of both layers (the teacher in exact mode, the
# student in --ep-mode; graph-safe's slots have a capacity factor of
# --ep-capacity, 2 by default, and the summary counts the rows they dropped),
# draws its own tokens (rank 0's are the one-device run's) and learns the
# mean of the ranks' losses: the router's gradient is averaged over the
# ranks, and a local expert's, which sums over every rank's tokens, steps
# with LR / W. Rank 0 alone prints, the group's numbers: loss, aux loss and
# agreement averaged over the ranks, the load counted over all their tokens.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import argparse
import array
import math
import os
import random
import sys
import time

import gi
gi.require_version('Gmlp', '1.0')
from gi.repository import GLib, Gmlp  # noqa: E402

parser = argparse.ArgumentParser(description='A student MoE layer learns a teacher MoE layer.')
parser.add_argument('steps', nargs='?', type=int, default=20)
parser.add_argument('--experts', type=int, default=8, help='experts (default 8; --ep: a multiple of the ranks)')
parser.add_argument('--ep', action='store_true',
                    help='train expert-parallel, one rank per process: run under gmlp-launch -n N')
parser.add_argument('--ep-mode', choices=('exact', 'graph-safe'),
                    help="--ep: how the student's rows travel (default exact)")
parser.add_argument('--ep-capacity', type=float,
                    help="--ep-mode graph-safe: the slots' expert capacity factor (default 2; 0: never drop)")
args = parser.parse_args()
if (args.ep_mode is not None or args.ep_capacity is not None) and not args.ep:
    parser.error('--ep-mode and --ep-capacity go with --ep')
if args.ep_capacity is not None and (args.ep_mode != 'graph-safe' or not args.ep_capacity >= 0):
    parser.error('--ep-capacity sizes the slots of --ep-mode graph-safe: a factor of 0 or more')

E, K, H, F, T = args.experts, 2, 32, 48, 512
steps = args.steps
LR, LR_ROUTER, NOISE = 0.5, 50.0, 0.5
FLAGS = Gmlp.LinearFlags.BIAS | Gmlp.LinearFlags.SINGLE_GROUPED_WEIGHT
EP_MODES = {'exact': Gmlp.ExpertParallelMode.EXACT, 'graph-safe': Gmlp.ExpertParallelMode.GRAPH_SAFE}


def make_layer(dev, **extra):
    layer = Gmlp.MoELayer(device=dev, hidden=H, ffn_hidden=F, n_experts=E, top_k=K,
                          dtype=Gmlp.DType.FLOAT32, flags=FLAGS, **extra)
    layer.init(None)   # raises what construction found
    return layer


def values(tensor, code):
    return array.array(code, tensor.to_bytes().get_data())


def reduced(comm, numbers, code, op):
    """numbers (array code 'f' or 'q'), reduced over the ranks by op."""
    dtype = Gmlp.DType.FLOAT32 if code == 'f' else Gmlp.DType.INT64
    tensor = Gmlp.GroupedTensor.new_from_bytes(comm.get_device(), dtype, [1], len(numbers),
                                               GLib.Bytes.new(array.array(code, numbers).tobytes()))
    comm.all_reduce(tensor, op)
    return values(tensor, code)


comm, rank, world = None, 0, 1
if args.ep:
    try:
        comm = Gmlp.Communicator.new_from_launcher()
    except GLib.Error as e:
        sys.exit('demo.py: --ep: %s; run it as gmlp-launch -n N %s %s --ep'
                 % (e.message, sys.executable, sys.argv[0]))
    rank, world = comm.get_rank(), comm.get_world_size()
say = print if rank == 0 else (lambda *_: None)

if comm is not None:
    # Both layers expert-parallel over the one group; the teacher in exact
    # mode, which never drops a row, so that each rank's teacher is the
    # one-device teacher over its tokens.
    dev = comm.get_device()
    mode = EP_MODES[args.ep_mode or 'exact']
    teacher = make_layer(dev, communicator=comm, expert_parallel_mode=Gmlp.ExpertParallelMode.EXACT)
    capacity = 0.0
    if mode == Gmlp.ExpertParallelMode.GRAPH_SAFE:
        capacity = args.ep_capacity if args.ep_capacity is not None else 2.0
    student = make_layer(dev, aux_loss_coeff=0.01, communicator=comm, expert_parallel_mode=mode,
                         expert_capacity_factor=capacity)
else:
    # The MoE layer is on the CPU only for now: a device chosen by default
    # falls back to the CPU; one named in GMLP_DEVICE is an error (as
    # gmlp-demo).
    dev = Gmlp.Device.get_default()
    try:
        teacher = make_layer(dev)
    except GLib.Error as e:
        if not e.matches(Gmlp.error_quark(), Gmlp.Error.UNSUPPORTED) or os.environ.get('GMLP_DEVICE'):
            raise
        print('notice: the MoE layer does not run on %s yet; training on the CPU' % dev.get_name())
        dev = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0)
        teacher = make_layer(dev)
    student = make_layer(dev, aux_loss_coeff=0.01)
teacher.init_parameters(1)
student.init_parameters(2)

# The teacher's gate: confident, expert e's row scaled by 0.5 + e / (E - 1).
rng = random.Random(1)
gate = array.array('f', (rng.gauss(0, 2 / math.sqrt(H)) * (0.5 + (i // H) / (E - 1)) for i in range(E * H)))
teacher.get_router().set_weight_from_bytes(GLib.Bytes.new(gate.tobytes()))
# The student's experts: the teacher's plus half a fresh draw.
for fc_s, fc_t in ((student.get_experts().get_fc1(), teacher.get_experts().get_fc1()),
                   (student.get_experts().get_fc2(), teacher.get_experts().get_fc2())):
    for s, t in ((fc_s.get_weight(), fc_t.get_weight()), (fc_s.get_bias(), fc_t.get_bias())):
        s.scale(NOISE)
        s.add_scaled(1.0, t)

x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, [T], H)
losses, agreements, dropped = [], [], 0


def step_once(step):
    """One step: (loss, aux, agreement, load, rows dropped), the group's."""
    start = time.monotonic()
    x.fill_random(rank * 100003 + step, 1.0)   # each rank its own tokens
    target = teacher.forward(x)[0]
    y, saved = student.forward(x)
    y.add_scaled(-1.0, target)               # y - t
    loss = y.sum_squares() / (2 * T)
    y.scale(1.0 / T)                         # dy = (y - t) / T
    student.backward(saved, y)
    router = student.get_router()
    if comm is not None:
        comm.all_reduce(router.get_wgrad(), Gmlp.ReduceOp.AVERAGE)
    for fc in (student.get_experts().get_fc1(), student.get_experts().get_fc2()):
        fc.get_weight().add_scaled(-LR / world, fc.get_wgrad())
        fc.get_bias().add_scaled(-LR / world, fc.get_bgrad())
    router.get_weight().add_scaled(-LR_ROUTER, router.get_wgrad())
    dev.synchronize()
    seconds = time.monotonic() - start

    chosen_t = values(teacher.get_routing().get_indices(), 'q')
    chosen_s = values(student.get_routing().get_indices(), 'q')
    agree = sum(len(set(chosen_t[t * K:(t + 1) * K]) & set(chosen_s[t * K:(t + 1) * K]))
                for t in range(T)) / (T * K)
    load = values(student.get_tokens_per_expert(), 'q')
    aux = values(student.get_aux_loss(), 'f')[0]
    lost = 0
    if comm is not None:
        rows_dropped = student.get_dropped_rows()
        lost = values(rows_dropped, 'q')[0] if rows_dropped is not None else 0
        loss, aux, agree = reduced(comm, [loss, aux, agree], 'f', Gmlp.ReduceOp.AVERAGE)
        counts = reduced(comm, list(load) + [lost], 'q', Gmlp.ReduceOp.SUM)
        load, lost = counts[:E], counts[E]
    return loss, aux, agree, load, lost, seconds


for step in range(1, steps + 1):
    try:
        loss, aux, agree, load, lost, seconds = step_once(step)
    except GLib.Error:
        if comm is not None:
            comm.abort()   # the other ranks get ABORTED at once, not at the timeout
        raise
    losses.append(loss)
    agreements.append(agree)
    dropped += lost
    say('step %3d  loss %.6f  aux %.6f  agree %.3f  %.0f tokens/s  load %d-%d'
        % (step, loss, aux, agree, T * world / seconds, min(load), max(load)))

q = max(len(losses) // 4, 1)
first, last = sum(losses[:q]) / q, sum(losses[-q:]) / q
rise = sum(agreements[-q:]) / q - sum(agreements[:q]) / q
say('loss %.6f -> %.6f, routing agreement %+.3f' % (first, last, rise))
if args.ep_mode == 'graph-safe':
    say('rows dropped past the slots: %d of %d' % (dropped, T * world * K * steps))
sys.exit(0 if last <= 0.7 * first and rise >= 0.1 else 1)
