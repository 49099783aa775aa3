#!/usr/bin/python3
# The gmlp-demo, shorter, in Python: a student GroupedMLP learns a fixed
# random teacher; uneven routing, forward, backward and SGD every step.
#
#   /usr/bin/python3 examples/demo.py [steps]
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import random
import sys
import time

import gi
gi.require_version('Gmlp', '1.0')
from gi.repository import Gmlp  # noqa: E402

E, H, F, T = 4, 32, 48, 512
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
lr = 0.5

dev = Gmlp.Device.get_default()
flags = Gmlp.LinearFlags.BIAS | Gmlp.LinearFlags.SINGLE_GROUPED_WEIGHT
teacher = Gmlp.GroupedMLP.new_full(dev, E, H, F, Gmlp.Activation.SWIGLU, Gmlp.DType.FLOAT32, flags)
student = Gmlp.GroupedMLP.new_full(dev, E, H, F, Gmlp.Activation.SWIGLU, Gmlp.DType.FLOAT32, flags)
teacher.init_parameters(1)
student.init_parameters(2)
rng = random.Random(1)
losses = []

for step in range(1, steps + 1):
    start = time.monotonic()
    experts = rng.choices(range(E), weights=[e + 1 for e in range(E)], k=T)
    rows = [experts.count(e) for e in range(E)]
    x = Gmlp.GroupedTensor.new(dev, Gmlp.DType.FLOAT32, rows, H)
    x.fill_random(step, 1.0)
    target = teacher.forward(x)[0]
    y, saved = student.forward(x)
    y.add_scaled(-1.0, target)               # y - t
    loss = y.sum_squares() / (2 * T)
    y.scale(1.0 / T)                         # dy = (y - t) / T
    student.backward(saved, y)
    for layer in (student.get_fc1(), student.get_fc2()):
        layer.get_weight().add_scaled(-lr, layer.get_wgrad())
        layer.get_bias().add_scaled(-lr, layer.get_bgrad())
    dev.synchronize()
    losses.append(loss)
    print('step %3d  loss %.6f  %.0f tokens/s' % (step, loss, T / (time.monotonic() - start)))

print('loss %.6f -> %.6f' % (losses[0], losses[-1]))
sys.exit(0 if losses[-1] < losses[0] else 1)
