#!/usr/bin/python3
# Python binding test: a student Gmlp.MoELayer learns a teacher MoE layer
# whose routing is known (its gate weight set from numpy and held fixed).
# Both are built from keyword properties. The student starts from the
# teacher's experts with noise and a gate of its own, and learns by plain
# SGD on every parameter (the experts' weights and biases, the router's
# gate): each step reads the gradients and applies add_scaled. The loss
# must fall, and the fraction of tokens whose top-1 expert is the
# teacher's must rise from chance. Deterministic: fixed seeds.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os

import numpy as np

import gi

gi.require_version('Gmlp', '1.0')
from gi.repository import GLib, Gmlp  # noqa: E402

DEV = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0)
E, K, H, F, T = 8, 2, 16, 16, 256
STEPS, CHECK_EVERY = 1500, 250
LR, LR_GATE, NOISE = 0.1, 1.0, 0.5
FLAGS = Gmlp.LinearFlags.BIAS | Gmlp.LinearFlags.SINGLE_GROUPED_WEIGHT

rng = np.random.default_rng(20240601)


def upload(array):
    array = np.ascontiguousarray(array, dtype=np.float32)
    return Gmlp.GroupedTensor.new_from_bytes(DEV, Gmlp.DType.FLOAT32, [array.shape[0]], array.shape[1],
                                             GLib.Bytes.new(array.tobytes()))


def download(tensor, dtype=np.float32):
    return np.frombuffer(tensor.to_bytes().get_data(), dtype=dtype).copy()


def make_layer(**extra):
    layer = Gmlp.MoELayer(device=DEV, hidden=H, ffn_hidden=F, n_experts=E, top_k=K,
                          activation=Gmlp.Activation.SWIGLU, dtype=Gmlp.DType.FLOAT32, flags=FLAGS, **extra)
    layer.init(None)   # GInitable: raises what construction found
    assert layer.get_n_experts() == E and layer.get_top_k() == K and layer.props.hidden == H
    assert layer.props.ffn_hidden == F and layer.get_shared_expert() is None
    return layer


def top1(layer):
    return download(layer.get_routing().get_indices(), np.int64).reshape(-1, K)[:, 0]


def parameters(layer):
    """Every parameter, its gradient and its learning rate: the experts'
    weights and biases, the gate."""
    triples = []
    for fc in (layer.get_experts().get_fc1(), layer.get_experts().get_fc2()):
        triples += [(fc.get_weight(), fc.get_wgrad(), LR), (fc.get_bias(), fc.get_bgrad(), LR)]
    router = layer.get_router()
    triples.append((router.get_weight(), router.get_wgrad(), LR_GATE))
    return triples


def test_moe_layer_teacher_student():
    teacher = make_layer()
    student = make_layer(aux_loss_coeff=1e-3)
    teacher.init_parameters(1)
    student.init_parameters(2)

    # The teacher's gate: fixed, confident (logits of about ±2).
    gate = (rng.standard_normal((E, H)) * 2.0 / np.sqrt(H)).astype(np.float32)
    teacher.get_router().set_weight_from_bytes(GLib.Bytes.new(gate.tobytes()))
    # The student's experts: the teacher's, with noise; its gate its own.
    for fc_t, fc_s in ((teacher.get_experts().get_fc1(), student.get_experts().get_fc1()),
                       (teacher.get_experts().get_fc2(), student.get_experts().get_fc2())):
        for get, put in ((lambda fc: fc.get_weight(), lambda fc, b: fc.set_weight_from_bytes(b)),
                         (lambda fc: fc.get_bias(), lambda fc, b: fc.set_bias_from_bytes(b))):
            v = download(get(fc_t))
            v = (v + NOISE * np.std(v) * rng.standard_normal(v.shape)).astype(np.float32)
            put(fc_s, GLib.Bytes.new(v.tobytes()))

    # The teacher routes as its gate says: softmax, top-2 (where clear).
    x_eval = rng.standard_normal((1024, H)).astype(np.float32)
    teacher.forward(upload(x_eval))
    logits = x_eval.astype(np.float64) @ gate.astype(np.float64).T
    order = np.argsort(-logits, axis=1, kind='stable')
    ranked = np.take_along_axis(logits, order, axis=1)
    clear = np.min(ranked[:, :K] - ranked[:, 1:K + 1], axis=1) > 1e-4
    got = download(teacher.get_routing().get_indices(), np.int64).reshape(-1, K)
    assert clear.mean() > 0.9
    assert np.array_equal(got[clear], order[clear, :K]), 'the teacher routes by its gate'

    def agreement():
        x = upload(x_eval)
        teacher.forward(x)
        student.forward(x)
        return float(np.mean(top1(teacher) == top1(student)))

    losses, agreements = [], [agreement()]
    print('# before: top-1 agreement %.3f' % agreements[0])
    for step in range(1, STEPS + 1):
        x = upload(rng.standard_normal((T, H)).astype(np.float32))
        target, _ = teacher.forward(x)
        y, saved = student.forward(x)
        assert y.get_total_rows() == T and y.get_cols() == H and y.get_n_groups() == 1
        aux = download(student.get_aux_loss())
        assert aux.shape == (1,) and np.isfinite(aux[0]) and aux[0] > 0.0
        counts = download(student.get_tokens_per_expert(), np.int64)
        assert counts.shape == (E,) and counts.sum() == T * K

        # L = ‖y − target‖² / 2T: dL/dy = (y − target) / T.
        y.add_scaled(-1.0, target)
        losses.append(y.sum_squares() / (2 * T))
        y.scale(1.0 / T)
        dx = student.backward(saved, y)
        assert saved.is_consumed() and dx.get_total_rows() == T and dx.get_cols() == H

        for param, grad, lr in parameters(student):
            param.add_scaled(-lr, grad)
        if step % CHECK_EVERY == 0:
            agreements.append(agreement())
            print('# step %d: loss %.5f, top-1 agreement %.3f' % (step, np.mean(losses[-CHECK_EVERY:]),
                                                                  agreements[-1]))

    first, last = np.mean(losses[:20]), np.mean(losses[-100:])
    assert np.all(np.isfinite(losses))
    assert last < 0.4 * first, 'the loss fell from %.4f to %.4f only' % (first, last)
    # From chance (1/E, give or take) to most tokens, rising all along.
    assert agreements[0] < 0.4, agreements
    assert agreements[-1] > 0.7, agreements
    for a, b in zip(agreements, agreements[1:]):
        assert b > a - 0.05, agreements
    assert agreements[len(agreements) // 2] > agreements[0] + 0.2, agreements
