#!/usr/bin/python3
# Python binding test: a Gmlp.Router made from keyword properties, its
# forward and backward driven from numpy, every result compared with a
# float64 numpy reference (the backward with finite differences of the
# float64 loss, the choices held fixed); the expert bias updated from the
# routing's counts; bad properties raise GLib.Error.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os

import numpy as np

import gi

gi.require_version('Gmlp', '1.0')
from gi.repository import GLib, Gmlp  # noqa: E402

rng = np.random.default_rng(int(os.environ.get('GMLP_TEST_SEED', np.random.SeedSequence().entropy % (1 << 32))))
DEV = Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0)

T, H, E, K, GROUPS, TOPK_GROUPS = 20, 16, 8, 3, 4, 2
SCALE, AUX, Z = 2.5, 0.05, 0.01


def upload(array, dtype=np.float32, gdtype=Gmlp.DType.FLOAT32):
    array = np.ascontiguousarray(array, dtype=dtype)
    return Gmlp.GroupedTensor.new_from_bytes(DEV, gdtype, [array.shape[0]], array.shape[1],
                                             GLib.Bytes.new(array.tobytes()))


def download(tensor, dtype=np.float32):
    return np.frombuffer(tensor.to_bytes().get_data(), dtype=dtype).copy()


def close(got, want, what, tol=1e-4):
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert np.all(np.isfinite(got)), what + ': not finite'
    assert err <= tol, '%s: relative error %.3g' % (what, err)


def select(values):
    """DeepSeek-V3's group-limited top-k of one token; the smallest gap that decides it."""
    per = E // GROUPS
    groups = np.sort(values.reshape(GROUPS, per), axis=1)[:, ::-1][:, :2].sum(axis=1)
    gorder = sorted(range(GROUPS), key=lambda g: (-groups[g], g))
    allowed = [e for g in gorder[:TOPK_GROUPS] for e in range(g * per, (g + 1) * per)]
    order = sorted(allowed, key=lambda e: (-values[e], e))
    gap = abs(groups[gorder[TOPK_GROUPS - 1]] - groups[gorder[TOPK_GROUPS]])
    for a, b in zip(order[:K], order[1:K + 1]):
        gap = min(gap, abs(values[a] - values[b]))
    return order[:K], gap


def sigmoid(l):
    return 1.0 / (1.0 + np.exp(-l))


def token_loss(l, idx, gp, f):
    s = sigmoid(l)
    q = s[idx]
    p = SCALE * q / (q.sum() + 1e-20)
    m = l.max()
    lse = m + np.log(np.exp(l - m).sum())
    return gp @ p + AUX * E * (f @ (s / (s.sum() + 1e-20))) / T + Z * lse * lse / T


def test_router():
    router = Gmlp.Router(device=DEV, hidden=H, n_experts=E, top_k=K,
                         score_function=Gmlp.ScoreFunction.SIGMOID, n_expert_groups=GROUPS,
                         topk_groups=TOPK_GROUPS, expert_bias=True, scaling_factor=SCALE,
                         aux_loss_coeff=AUX, z_loss_coeff=Z)
    assert router.props.n_experts == E and router.props.top_k == K and router.get_hidden() == H
    ready = []
    router.connect('wgrad-ready', lambda _router, event: ready.append(event.synchronize()))

    w = (rng.standard_normal((E, H)) / np.sqrt(H)).astype(np.float32)
    bias = (rng.standard_normal(E) * 0.2).astype(np.float32)
    router.set_weight_from_bytes(GLib.Bytes.new(w.tobytes()))
    router.set_expert_bias_from_bytes(GLib.Bytes.new(bias.tobytes()))
    w64, b64 = w.astype(np.float64), bias.astype(np.float64)

    # Tokens whose choices are clear by 1e-4: float32 must then route as float64.
    x = np.empty((T, H), np.float32)
    for t in range(T):
        while True:
            x[t] = rng.standard_normal(H).astype(np.float32)
            if select(sigmoid(x[t].astype(np.float64) @ w64.T) + b64)[1] >= 1e-4:
                break
    logits = x.astype(np.float64) @ w64.T
    scores = sigmoid(logits)
    idx = np.array([select(scores[t] + b64)[0] for t in range(T)])
    q = np.take_along_axis(scores, idx, axis=1)
    probs = SCALE * q / (q.sum(axis=1, keepdims=True) + 1e-20)
    counts = np.bincount(idx.ravel(), minlength=E)
    dist = scores / (scores.sum(axis=1, keepdims=True) + 1e-20)
    aux = AUX * E * np.sum(counts / (T * K) * dist.mean(axis=0))
    m = logits.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True))).ravel()
    z = Z * np.mean(lse ** 2)

    routing, saved = router.forward(upload(x))
    assert routing.get_n_tokens() == T and routing.get_top_k() == K
    assert np.array_equal(download(routing.get_indices(), np.int64).reshape(T, K), idx)
    close(download(routing.get_probs()).reshape(T, K), probs, 'probabilities', 1e-5)
    assert np.array_equal(download(routing.get_tokens_per_expert(), np.int64), counts)
    close(download(routing.get_aux_loss()), np.array([aux]), 'aux loss', 1e-5)
    close(download(routing.get_z_loss()), np.array([z]), 'z loss', 1e-5)

    # Backward: d(Σ gp · probs + aux + z) / d(logits) by central differences.
    gp = rng.standard_normal((T, K)).astype(np.float32)
    dl = np.zeros((T, E))
    f = counts / (T * K)
    for t in range(T):
        for e in range(E):
            h = 1e-6 * max(1.0, abs(logits[t, e]))
            up, down = logits[t].copy(), logits[t].copy()
            up[e] += h
            down[e] -= h
            dl[t, e] = (token_loss(up, idx[t], gp[t], f) - token_loss(down, idx[t], gp[t], f)) / (2 * h)
    dx = router.backward(saved, upload(gp))
    assert saved.is_consumed() and ready == [True]
    close(download(dx).reshape(T, H), dl @ w64, 'dx')
    close(download(router.get_wgrad()).reshape(E, H), dl.T @ x.astype(np.float64), 'dW')

    # Aux-loss-free balancing: bias += rate × sign (mean − load).
    router.update_expert_bias(routing.get_tokens_per_expert())
    want = (bias + np.float32(1e-3) * np.sign(counts.mean() - counts).astype(np.float32)).astype(np.float32)
    close(download(router.get_expert_bias()), want.astype(np.float64), 'expert bias', 1e-6)

    # Bad properties and bad calls raise, never crash.
    for props in [dict(top_k=0), dict(top_k=17, n_experts=32), dict(n_expert_groups=3, topk_groups=1),
                  dict(n_expert_groups=4, topk_groups=5), dict(z_loss_coeff=-1.0)]:
        kwargs = dict(device=DEV, hidden=H, n_experts=E, top_k=K)
        kwargs.update(props)
        try:
            Gmlp.Router(**kwargs).forward(upload(x))
            raise AssertionError('no error for %r' % props)
        except GLib.Error as e:
            assert e.matches(Gmlp.error_quark(), Gmlp.Error.INVALID_ARGUMENT), e
    try:
        router.forward(upload(x[:, :H - 1]))
        raise AssertionError('no error for the wrong width')
    except GLib.Error as e:
        assert e.matches(Gmlp.error_quark(), Gmlp.Error.SHAPE_MISMATCH), e
