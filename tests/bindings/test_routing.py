#!/usr/bin/python3
# Python binding test: a routing made in numpy, permute → combine and both
# backwards through PyGObject, every result against a float64 numpy reference
# of the dense formulation.
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import os

import numpy as np

import gi

gi.require_version('Gmlp', '1.0')
from gi.repository import GLib, Gmlp  # noqa: E402

rng = np.random.default_rng(int(os.environ.get('GMLP_TEST_SEED', np.random.SeedSequence().entropy % (1 << 32))))


def upload(dev, array, dtype):
    np_type = {Gmlp.DType.FLOAT32: np.float32, Gmlp.DType.INT64: np.int64}[dtype]
    array = np.ascontiguousarray(array, dtype=np_type)
    return Gmlp.GroupedTensor.new_from_bytes(dev, dtype, [array.shape[0]], array.shape[1],
                                             GLib.Bytes.new(array.tobytes()))


def download(tensor, dtype=np.float32):
    return np.frombuffer(tensor.to_bytes().get_data(), dtype=dtype).astype(np.float64)


def close(got, want, what, tol=2e-5):
    assert np.all(np.isfinite(got)), what + ': not finite'
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert err <= tol, '%s: relative error %.3g' % (what, err)


def device():
    return Gmlp.Device.new(Gmlp.DeviceKind.CPU, 0) if os.environ.get('GMLP_DEVICE', 'cpu') == 'cpu' \
        else Gmlp.Device.get_default()


def reference_map(idx, E, padding):
    """Slot of each choice (-1: none) and padded rows per expert, from the
    documented rule: expert by expert, choices in token order (a stable
    sort), padding rows after each expert's."""
    flat = idx.ravel()
    slot = np.full(flat.shape, -1, dtype=np.int64)
    sizes = np.zeros(E, dtype=np.int64)
    start = 0
    for e in range(E):
        chosen = np.nonzero(flat == e)[0]
        slot[chosen] = start + np.arange(len(chosen))
        sizes[e] = -(-len(chosen) // padding) * padding
        start += sizes[e]
    return slot.reshape(idx.shape), sizes


def test_round_trip():
    dev = device()
    T, k, E, H, padding = 37, 2, 6, 16, 16
    idx = rng.integers(0, E, size=(T, k))
    idx[0, 1] = -1           # out of range: dropped
    idx[5, 0] = E
    probs = rng.uniform(0.1, 1.0, size=(T, k)).astype(np.float32)
    x = rng.standard_normal((T, H)).astype(np.float32)
    routing = Gmlp.Routing.new(dev, upload(dev, idx, Gmlp.DType.INT64), upload(dev, probs, Gmlp.DType.FLOAT32), E)
    assert routing.get_n_tokens() == T and routing.get_top_k() == k and routing.get_n_experts() == E

    valid = (idx >= 0) & (idx < E)
    counts = download(routing.get_tokens_per_expert(), np.int64)
    assert np.array_equal(counts, np.bincount(idx[valid], minlength=E)), counts

    perm = routing.permute_full(upload(dev, x, Gmlp.DType.FLOAT32), padding, 0.0)
    assert perm.get_n_groups() == E and not perm.has_host_sizes()
    slot, sizes = reference_map(idx, E, padding)
    assert list(perm.read_sizes()) == list(sizes), (perm.read_sizes(), sizes)

    # Permuted rows: each choice's token at its slot, zero padding rows.
    want = np.zeros((int(sizes.sum()), H))
    for t, j in zip(*np.nonzero(valid)):
        want[slot[t, j]] = x[t]
    assert np.array_equal(download(perm).reshape(-1, H), want)

    # Combine of the permuted tokens: each token times the sum of its
    # kept probabilities; with the probabilities 1/k it would be x.
    out = download(routing.combine(perm)).reshape(T, H)
    weight = np.where(valid, probs.astype(np.float64), 0.0).sum(axis=1)
    close(out, x * weight[:, None], 'combine')

    # Backwards, with y = the permuted tokens.
    go = rng.standard_normal((T, H)).astype(np.float32)
    grad_y, grad_probs = routing.combine_backward(upload(dev, go, Gmlp.DType.FLOAT32), perm)
    want_gy = np.zeros_like(want)
    want_gp = np.zeros((T, k))
    for t, j in zip(*np.nonzero(valid)):
        want_gy[slot[t, j]] = probs[t, j] * go[t]
        want_gp[t, j] = go[t].astype(np.float64) @ x[t]
    close(download(grad_y).reshape(-1, H), want_gy, 'grad_y')
    close(download(grad_probs).reshape(T, k), want_gp, 'grad_probs')
    assert download(grad_probs).reshape(T, k)[0, 1] == 0.0

    # dx[t] = Σ_j grad_y[slot (t, j)] = the kept probabilities' sum × go[t]
    dx = download(routing.permute_backward(grad_y)).reshape(T, H)
    close(dx, go * weight[:, None], 'permute backward')


def test_errors():
    dev = device()
    idx = np.array([[0, 1], [1, 2]])
    probs = np.full((2, 2), 0.5, dtype=np.float32)
    routing = Gmlp.Routing.new(dev, upload(dev, idx, Gmlp.DType.INT64), upload(dev, probs, Gmlp.DType.FLOAT32), 3)
    x = upload(dev, np.ones((2, 4)), Gmlp.DType.FLOAT32)
    try:
        routing.combine(x)
        raise AssertionError('combine before permute succeeded')
    except GLib.Error as e:
        assert e.matches(Gmlp.error_quark(), Gmlp.Error.INVALID_STATE), e
    routing.permute(x)
    try:
        routing.combine(x)     # not in the permuted layout
        raise AssertionError('combine of the tokens succeeded')
    except GLib.Error as e:
        assert e.matches(Gmlp.error_quark(), Gmlp.Error.INVALID_ARGUMENT), e
    try:
        Gmlp.Routing.new(dev, upload(dev, probs, Gmlp.DType.FLOAT32), upload(dev, probs, Gmlp.DType.FLOAT32), 3)
        raise AssertionError('float indices accepted')
    except GLib.Error as e:
        assert e.matches(Gmlp.error_quark(), Gmlp.Error.DTYPE_MISMATCH), e
