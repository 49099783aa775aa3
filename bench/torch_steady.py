#!/usr/bin/env python3
"""torch_steady: the torch anchors of ../shared/bench/anchors.py
(torch._grouped_mm fprop and wgrad, torch._scaled_grouped_mm FP8 rowwise
fprop), timed both ways on gmlp-bench's problems, so that libgmlp can be
compared with them like for like.

anchors.py times with triton's do_bench: 25 ms of warm-up, then 200 ms of
calls, each after a 256 MB cache flush (a memset, which also lets the GPU
cool between products), and the median. gmlp-bench (its default "steady"
method) runs the op back to back for 400 ms, which brings the GPU to its
power limit, then takes the median of 100 calls with an event pair around
each. Both are printed here for the same problems: gmlp-bench's shapes and
its balanced and skewed splits (cublas_anchor.cu's generator; anchors.py
draws its skewed split from a Dirichlet law, a different problem), its
1 s rest before each shape and routing. gmlp-bench --method=do-bench times
libgmlp the do_bench way.

    python3 bench/torch_steady.py [-s SHAPE] [-n ITERS] [--rest-ms MS] [--warm-ms MS] [--dense]

--warm-ms sets the back-to-back time before each steady timing, as
gmlp-bench --warm-ms does (default 400).

--dense times instead one dense product of each shape's whole size (all M
rows by the first expert's weights: the same FLOPs, one GEMM):
torch.matmul in BF16 (cuBLAS), and torch._scaled_mm in FP8 E4M3 with
per-tensor scales (cuBLASLt), with and without fast accumulation, both
ways. Those are what the hardware gives one library call at the power
limit: the ceiling a grouped product of the same size can be held against.

One JSON line per shape and routing: OP_steady_tflops (gmlp-bench's
method) and OP_dobench_tflops (anchors.py's), OP one of grouped_fprop,
grouped_wgrad, fp8_grouped_fprop (with --dense: dense_bf16, dense_fp8,
dense_fp8_fast_accum).

SPDX-License-Identifier: LGPL-2.1-or-later
"""
import argparse
import json
import time

import torch
from triton.testing import do_bench

# gmlp-bench's shapes: name, experts, routed rows M, in K, out N.
SHAPES = [
    ("mixtral-fc1", 8, 16384, 4096, 14336),
    ("dsv3-fc1", 32, 32768, 7168, 2048),
    ("qwen3-fc1", 128, 65536, 2048, 768),
    ("small-e64", 64, 8192, 1024, 1024),
]
WARM_UP_MS = 400    # gmlp-bench's default --warm-ms
HOST_CALLS = 3      # gmlp-bench times three calls on the host first


def split_rows(experts, rows, skew):
    """gmlp-bench's split_rows(): the same integers, step for step."""
    if not skew:
        m = [rows // experts] * experts
        m[0] += rows - (rows // experts) * experts
        return m
    x, w = 12345, []
    for _ in range(experts):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF
        w.append(1.0 + ((x >> 8) % 1000) / 250.0)
    total = 0.0
    for v in w:   # not sum(): it compensates rounding since Python 3.12
        total += v
    align = 16
    m = [int(v / total * rows / align) * align for v in w]
    m[0] += rows - sum(m)
    return m


def steady_ms(fn, iters, warm_ms):
    """gmlp-bench's time_op(): host calls, warm_ms back to back, then the
    median of iters calls, each between two events."""
    for _ in range(HOST_CALLS):
        torch.cuda.synchronize()
        fn()
    start, i = time.monotonic(), 0
    while time.monotonic() - start < warm_ms / 1000.0:
        fn()
        if i % 4 == 3:
            torch.cuda.synchronize()
        i += 1
    torch.cuda.synchronize()
    events = []
    for _ in range(iters):
        before = torch.cuda.Event(enable_timing=True)
        after = torch.cuda.Event(enable_timing=True)
        before.record()
        fn()
        after.record()
        events.append((before, after))
    torch.cuda.synchronize()
    ms = sorted(b.elapsed_time(a) for b, a in events)
    return ms[len(ms) // 2]


def dobench_ms(fn):
    """anchors.py's bench()."""
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def report(row, ops, args, flops):
    """Times each op of ops into row (steady, then do_bench), prints it."""
    torch.cuda.synchronize()
    time.sleep(args.rest_ms / 1000.0)
    for op, fn in ops.items():
        try:
            fn()
            row[op + "_steady_ms"] = steady_ms(fn, args.iters, args.warm_ms)
        except RuntimeError as e:
            row[op + "_err"] = repr(e)[:300]
    # do_bench after every steady timing: it starts from the power
    # limit here, where anchors.py's follows whatever ran before.
    for op, fn in ops.items():
        if op + "_err" not in row:
            row[op + "_dobench_ms"] = dobench_ms(fn)
    for k in list(row):
        if k.endswith("_ms"):
            row[k[:-3] + "_tflops"] = round(flops / (row[k] * 1e-3) / 1e12, 1)
    print(json.dumps(row), flush=True)


def dense(args, dev):
    """--dense: one product of each shape's whole size."""
    for name, E, M, K, N in SHAPES:
        if args.shape and args.shape != name:
            continue
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
        wt = w.t()
        xf = x.to(torch.float8_e4m3fn)
        wft = w.to(torch.float8_e4m3fn).t()   # column-major, as _scaled_mm takes B
        one = torch.ones((), device=dev, dtype=torch.float32)
        ops = {
            "dense_bf16": lambda: torch.matmul(x, wt),
            "dense_fp8": lambda: torch._scaled_mm(xf, wft, one, one, out_dtype=torch.bfloat16),
            "dense_fp8_fast_accum": lambda: torch._scaled_mm(xf, wft, one, one, out_dtype=torch.bfloat16,
                                                             use_fast_accum=True),
        }
        row = {"bench": "torch-dense-steady", "device": torch.cuda.get_device_name(0),
               "torch": torch.__version__, "shape": name, "M": M, "K": K, "N": N}
        report(row, ops, args, 2.0 * M * N * K)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-s", "--shape")
    parser.add_argument("-n", "--iters", type=int, default=100)
    parser.add_argument("--rest-ms", type=int, default=1000)
    parser.add_argument("--warm-ms", type=int, default=WARM_UP_MS)
    parser.add_argument("--dense", action="store_true")
    args = parser.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    if args.dense:
        dense(args, dev)
        return

    for name, E, M, K, N in SHAPES:
        if args.shape and args.shape != name:
            continue
        for skew in (False, True):
            sizes = split_rows(E, M, skew)
            offs = torch.cumsum(torch.tensor(sizes), 0).to(torch.int32).to(dev)
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            w = torch.randn(E, N, K, device=dev, dtype=torch.bfloat16) * 0.02
            dy = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
            wt = w.transpose(-2, -1)
            xf = x.to(torch.float8_e4m3fn)
            wft = w.to(torch.float8_e4m3fn).transpose(-2, -1)
            sx = torch.ones(M, device=dev, dtype=torch.float32)
            sw = torch.ones(E, N, device=dev, dtype=torch.float32)
            ops = {
                "grouped_fprop": lambda: torch._grouped_mm(x, wt, offs=offs),
                "grouped_wgrad": lambda: torch._grouped_mm(dy.t(), x, offs=offs),
                "fp8_grouped_fprop": lambda: torch._scaled_grouped_mm(
                    xf, wft, sx, sw, offs=offs, out_dtype=torch.bfloat16),
            }
            flops = 2.0 * M * N * K
            row = {"bench": "torch-steady", "device": torch.cuda.get_device_name(0),
                   "torch": torch.__version__, "shape": name, "E": E, "M": M, "K": K, "N": N,
                   "skew": skew}
            report(row, ops, args, flops)


if __name__ == "__main__":
    main()
