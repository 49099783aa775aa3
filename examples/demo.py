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
#   /usr/bin/python3 examples/demo.py [steps]
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import array
import math
import os
import random
import sys
import time

import gi
gi.require_version('Gmlp', '1.0')
from gi.repository import GLib, Gmlp  # noqa: E402

E, K, H, F, T = 8, 2, 32, 48, 512
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
LR, LR_ROUTER, NOISE = 0.5, 50.0, 0.5
FLAGS = Gmlp.LinearFlags.BIAS | Gmlp.LinearFlags.SINGLE_GROUPED_WEIGHT


def make_layer(dev, **extra):
    layer = Gmlp.MoELayer(device=dev, hidden=H, ffn_hidden=F, n_experts=E, top_k=K,
                          dtype=Gmlp.DType.FLOAT32, flags=FLAGS, **extra)
    layer.init(None)   # raises what construction found
    return layer


def values(tensor, code):
    return array.array(code, tensor.to_bytes().get_data())


# The MoE layer is on the CPU only for now: a device chosen by default falls
# back to the CPU; one named in GMLP_DEVICE is an error (as gmlp-demo).
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
losses, agreements = [], []
for step in range(1, steps + 1):
    start = time.monotonic()
    x.fill_random(step, 1.0)
    target = teacher.forward(x)[0]
    y, saved = student.forward(x)
    y.add_scaled(-1.0, target)               # y - t
    loss = y.sum_squares() / (2 * T)
    y.scale(1.0 / T)                         # dy = (y - t) / T
    student.backward(saved, y)
    for fc in (student.get_experts().get_fc1(), student.get_experts().get_fc2()):
        fc.get_weight().add_scaled(-LR, fc.get_wgrad())
        fc.get_bias().add_scaled(-LR, fc.get_bgrad())
    router = student.get_router()
    router.get_weight().add_scaled(-LR_ROUTER, router.get_wgrad())
    dev.synchronize()
    seconds = time.monotonic() - start

    chosen_t = values(teacher.get_routing().get_indices(), 'q')
    chosen_s = values(student.get_routing().get_indices(), 'q')
    agree = sum(len(set(chosen_t[t * K:(t + 1) * K]) & set(chosen_s[t * K:(t + 1) * K]))
                for t in range(T)) / (T * K)
    load = values(student.get_tokens_per_expert(), 'q')
    aux = values(student.get_aux_loss(), 'f')[0]
    losses.append(loss)
    agreements.append(agree)
    print('step %3d  loss %.6f  aux %.6f  agree %.3f  %.0f tokens/s  load %d-%d'
          % (step, loss, aux, agree, T / seconds, min(load), max(load)))

q = max(len(losses) // 4, 1)
first, last = sum(losses[:q]) / q, sum(losses[-q:]) / q
rise = sum(agreements[-q:]) / q - sum(agreements[:q]) / q
print('loss %.6f -> %.6f, routing agreement %+.3f' % (first, last, rise))
sys.exit(0 if last <= 0.7 * first and rise >= 0.1 else 1)
