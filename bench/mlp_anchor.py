"""The anchor for gmlp-bench --mlp: one forward+backward step of a grouped
SwiGLU MLP written with torch._grouped_mm and torch.nn.functional, timed
with triton's do_bench (median), on the anchor shapes of ../shared/bench
(experts E, routed rows M, hidden K, ffn_hidden N), balanced and with the
skewed split of cublas_anchor.cu. One JSON line per shape and routing.

    python3 bench/mlp_anchor.py
"""
import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench

SHAPES = [
    ("mixtral-fc1", 8, 16384, 4096, 14336),
    ("dsv3-fc1", 32, 32768, 7168, 2048),
    ("qwen3-fc1", 128, 65536, 2048, 768),
    ("small-e64", 64, 8192, 1024, 1024),
]


def split(E, M, skew):
    """The routing of cublas_anchor.cu and gmlp-bench."""
    if not skew:
        m = [M // E] * E
        m[0] += M - sum(m)
        return m
    x, w = 12345, []
    for _ in range(E):
        x = (x * 1103515245 + 12345) % (1 << 32)
        w.append(1.0 + ((x >> 8) % 1000) / 250.0)
    total = sum(w)
    m = [int(v / total * M / 16) * 16 for v in w]
    m[0] += M - sum(m)
    return m


torch.manual_seed(0)
dev = "cuda"
for name, E, M, K, N in SHAPES:
    for skew in (False, True):
        m = split(E, M, skew)
        offs = torch.tensor(m, device=dev).cumsum(0).to(torch.int32)
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16, requires_grad=True)
        w1 = (torch.randn(E, 2 * N, K, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_()
        w2 = (torch.randn(E, K, N, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_()
        dy = torch.randn(M, K, device=dev, dtype=torch.bfloat16)

        def step():
            h = torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs)
            a = F.silu(h[:, :N]) * h[:, N:]
            y = torch._grouped_mm(a, w2.transpose(-2, -1), offs=offs)
            y.backward(dy)

        row = {"bench": "torch-mlp", "shape": name, "E": E, "M": M, "K": K, "N": N, "skew": skew}
        try:
            ms = do_bench(step, warmup=25, rep=200, return_mode="median")
            row["ms"] = ms
            row["tflops"] = round(18.0 * M * K * N / (ms * 1e-3) / 1e12, 1)
        except Exception as e:   # report, do not stop the other shapes
            row["error"] = repr(e)[:300]
        print(json.dumps(row), flush=True)
        del x, w1, w2, dy
        torch.cuda.empty_cache()
