#!/usr/bin/env python3
# Merges gmlp-bench's JSON lines with the anchors of ../shared/bench measured
# in the same run (anchors.py, cublas_anchor) into a Markdown table of
# TFLOP/s and ratios. Lines of gmlp-bench --fp8 ("dtype":"fp8-RECIPE") get
# tables of their own (per recipe and "quantize" mode), against torch._scaled_grouped_mm (FP8 rowwise).
# Lines of gmlp-bench --quantize ("bench":"gmlp-quantize") get a table of
# GB/s against the device-to-device copy that anchors.py measures.
#
#   compare.py GMLP.jsonl ANCHORS.jsonl CUBLAS.jsonl [STEADY.jsonl [TORCH-STEADY.jsonl]]
#
# STEADY.jsonl (bench/cublas_loop_steady.cu) is the anchor's cuBLAS loop timed
# as gmlp-bench times; given, the host-sizes BF16 fprop table has a column
# for it and the ratio to it, the like-for-like comparison.
# TORCH-STEADY.jsonl (bench/torch_steady.py) holds the torch anchors timed
# both ways on gmlp-bench's problems; given, a last table sets them beside
# gmlp-bench's lines of each method (--method=do-bench lines say so).
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import json
import sys


def lines(path):
    out = []
    try:
        for line in open(path):
            line = line.strip()
            if line.startswith('{'):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return out


gmlp = {}
fp8 = {}
quantize = {}
# Lines of gmlp-bench --method=do-bench, by (kind, sizes, shape, skew, op);
# kind is 'bf16' or the FP8 recipe as in fp8's keys.
dobench = {}
for r in lines(sys.argv[1]):
    if r.get('bench') == 'gmlp-quantize':
        quantize[(r['recipe'], r.get('sizes', 'host'), r['shape'], bool(r['skew']), bool(r['columnwise']))] = r
    if r.get('bench') != 'gmlp':
        continue
    dtype = r.get('dtype', 'bf16')
    # The recipe, and where the operands were quantized.
    kind = 'bf16' if not dtype.startswith('fp8-') else \
        dtype[4:] + ('' if r.get('quantize', 'per-call') == 'per-call' else '/outside')
    key = (r.get('sizes', 'host'), r['shape'], bool(r['skew']), r['op'])
    if r.get('method', 'steady') == 'do-bench':
        dobench[(kind,) + key] = r
    elif kind != 'bf16':
        fp8[(kind,) + key] = r
    else:
        gmlp[key] = r
torch = {(r['shape'], bool(r['skew'])): r for r in lines(sys.argv[2]) if 'shape' in r}
copy_gbps = next((r['d2d_GBps_rw'] for r in lines(sys.argv[2]) if 'd2d_GBps_rw' in r), None)
cublas = {(r['shape'], bool(r['skew'])): r for r in lines(sys.argv[3]) if 'shape' in r}
# None without a fourth argument: the table keeps its old columns.
steady = ({(r['shape'], bool(r['skew'])): r for r in lines(sys.argv[4]) if 'shape' in r}
          if len(sys.argv) > 4 else None)
torch_steady = ({(r['shape'], bool(r['skew'])): r for r in lines(sys.argv[5]) if 'shape' in r}
                if len(sys.argv) > 5 else None)


def f(v):
    return '–' if v is None else '%.0f' % v


def ratio(a, b):
    return '–' if a is None or not b else '%.2f×' % (a / b)


TITLES = {'host': 'group sizes on the host (cuBLAS, or the Hopper kernel for many small experts)',
          'device': "group sizes on the device (libgmlp's Hopper kernel)"}


def report(sizes):
    shapes = []
    for (path, shape, skew, op) in gmlp:
        if path == sizes and (shape, skew) not in shapes:
            shapes.append((shape, skew))
    if not shapes:
        return

    print('## %s\n' % TITLES.get(sizes, sizes))
    # The steady loop is the reference of the host-sizes path (cuBLAS there).
    with_steady = steady is not None and sizes == 'host'
    print('### fprop (y = x Wᵀ), BF16, TFLOP/s\n')
    if with_steady:
        print('cuBLAS loop (steady): the same loop timed as gmlp-bench times libgmlp, 400 ms '
              'back to back then the median of the timed calls (bench/cublas_loop_steady.cu); '
              'cuBLAS loop: 10 calls then the median of 30.\n')
    cols = ['shape', 'routing', 'libgmlp', 'cuBLAS loop'] + (['cuBLAS loop (steady)'] if with_steady else []) + \
        ['cuBLAS 4 streams', 'cuBLAS grouped batched', 'torch._grouped_mm', 'vs loop'] + \
        (['vs loop (steady)'] if with_steady else []) + \
        ['vs grouped batched', 'vs best anchor', 'skewed / balanced', 'host µs/call']
    print('| %s |' % ' | '.join(cols))
    print('|%s' % ('---|' * len(cols)))
    for shape, skew in shapes:
        g = gmlp.get((sizes, shape, skew, 'fprop'), {})
        bal = gmlp.get((sizes, shape, False, 'fprop'), {})
        c = cublas.get((shape, skew), {})
        t = torch.get((shape, skew), {})
        ours = g.get('tflops')
        loop = c.get('cublas_loop1_tflops')
        loop4 = c.get('cublas_loop4stream_tflops')
        grouped = c.get('cublas_grouped_batched_tflops')
        tg = t.get('grouped_fprop_tflops')
        best = max([v for v in (loop, loop4, grouped, tg) if v] or [0])
        loop_steady = steady.get((shape, skew), {}).get('cublas_loop_steady_tflops') if with_steady else None
        cells = [shape, 'skewed' if skew else 'balanced', f(ours), f(loop)] + \
            ([f(loop_steady)] if with_steady else []) + \
            [f(loop4), f(grouped), f(tg), ratio(ours, loop)] + \
            ([ratio(ours, loop_steady)] if with_steady else []) + \
            [ratio(ours, grouped), ratio(ours, best),
             ratio(ours, bal.get('tflops')) if skew else '', '%.0f' % g.get('host_us', 0)]
        print('| %s |' % ' | '.join(cells))

    print('\n### wgrad (dW = dyᵀ x) and dgrad (dx = dy W), BF16, TFLOP/s\n')
    print('| shape | routing | libgmlp wgrad | torch loop wgrad | torch._grouped_mm wgrad | wgrad vs torch grouped | libgmlp dgrad | dgrad host µs | wgrad host µs |')
    print('|---|---|---|---|---|---|---|---|---|')
    for shape, skew in shapes:
        w = gmlp.get((sizes, shape, skew, 'wgrad'), {})
        d = gmlp.get((sizes, shape, skew, 'dgrad'), {})
        t = torch.get((shape, skew), {})
        print('| %s | %s | %s | %s | %s | %s | %s | %.0f | %.0f |' % (
            shape, 'skewed' if skew else 'balanced', f(w.get('tflops')), f(t.get('loop_wgrad_tflops')),
            f(t.get('grouped_wgrad_tflops')), ratio(w.get('tflops'), t.get('grouped_wgrad_tflops')),
            f(d.get('tflops')), d.get('host_us', 0), w.get('host_us', 0)))
    print()


for sizes in ('host', 'device'):
    report(sizes)


# The goals of the FP8 issue against torch._scaled_grouped_mm, per shape.
FP8_GOALS = {'mixtral-fc1': 1.3, 'dsv3-fc1': 1.3, 'qwen3-fc1': 1.5, 'small-e64': 1.5}


def report_fp8():
    recipes = []
    for (recipe, sizes, shape, skew, op) in fp8:
        if recipe not in recipes:
            recipes.append(recipe)
    for recipe in recipes:
        for sizes in ('host', 'device'):
            shapes = []
            for (rc, sz, shape, skew, op) in fp8:
                if rc == recipe and sz == sizes and (shape, skew) not in shapes:
                    shapes.append((shape, skew))
            if not shapes:
                continue
            name, _, outside = recipe.partition('/')
            print('## FP8, %s scaling, %s, %s\n' % (name, TITLES.get(sizes, sizes),
                                                  'operands quantized beforehand' if outside
                                                  else 'quantization per call'))
            if outside:
                print('TFLOP/s of 2 M K N: the products alone (x and dy quantized before the timed '
                      'calls, the weights cached), as torch._scaled_grouped_mm is timed.\n')
            else:
                print('TFLOP/s of 2 M K N, quantization included (fprop: x and W; dgrad: dy).\n')
            print('| shape | routing | fprop | torch._scaled_grouped_mm | vs torch | goal | vs libgmlp BF16 fprop | dgrad | wgrad | fprop host µs |')
            print('|---|---|---|---|---|---|---|---|---|---|')
            for shape, skew in shapes:
                fw = fp8.get((recipe, sizes, shape, skew, 'fprop'), {})
                dg = fp8.get((recipe, sizes, shape, skew, 'dgrad'), {})
                wg = fp8.get((recipe, sizes, shape, skew, 'wgrad'), {})
                t = torch.get((shape, skew), {})
                bf16 = gmlp.get((sizes, shape, skew, 'fprop'), {})
                ours = fw.get('tflops')
                anchor = t.get('fp8_grouped_fprop_tflops')
                goal = FP8_GOALS.get(shape)
                print('| %s | %s | %s | %s | %s | %s | %s | %s | %s | %.0f |' % (
                    shape, 'skewed' if skew else 'balanced', f(ours), f(anchor), ratio(ours, anchor),
                    '≥ %.1f×' % goal if goal else '–', ratio(ours, bf16.get('tflops')),
                    f(dg.get('tflops')), f(wg.get('tflops')), fw.get('host_us', 0)))
            print()


report_fp8()


def report_quantize():
    if not quantize:
        return
    print('## FP8 grouped quantize (gmlp-bench --quantize), BF16 x of M × K\n')
    print('GB/s of the least traffic (x read once, each FP8 copy written once); '
          'device-to-device copy in the same run: %s GB/s (read + write).\n' % f(copy_gbps))
    print('| recipe | sizes | shape | routing | rowwise GB/s | ms | + columnwise GB/s | ms | vs copy (+ columnwise) |')
    print('|---|---|---|---|---|---|---|---|---|')
    for (recipe, sizes, shape, skew, col) in quantize:
        if col:
            continue
        row = quantize[(recipe, sizes, shape, skew, False)]
        both = quantize.get((recipe, sizes, shape, skew, True), {})
        print('| %s | %s | %s | %s | %s | %.3f | %s | %.3f | %s |' % (
            recipe, sizes, shape, 'skewed' if skew else 'balanced', f(row.get('gbps')), row.get('ms', 0),
            f(both.get('gbps')), both.get('ms', 0), ratio(both.get('gbps'), copy_gbps)))
    print()


report_quantize()


# What each torch anchor is set beside, and the goal of its issue.
LIKE_FOR_LIKE = [
    ('bf16', 'fprop', 'grouped_fprop', 'BF16 fprop', lambda shape: 1.05),
    ('bf16', 'wgrad', 'grouped_wgrad', 'BF16 wgrad', lambda shape: 1.05),
    ('current/outside', 'fprop', 'fp8_grouped_fprop', 'FP8 current fprop', FP8_GOALS.get),
    ('delayed/outside', 'fprop', 'fp8_grouped_fprop', 'FP8 delayed fprop', FP8_GOALS.get),
]


def report_like_for_like():
    if not torch_steady:
        return
    # The steady lines of every kind, keyed as dobench is.
    steady_lines = {('bf16',) + key: r for key, r in gmlp.items()}
    steady_lines.update(fp8)
    print('## Against torch, like for like (bench/torch_steady.py)\n')
    print('Both sides on the same problems (gmlp-bench\'s splits) and timed the same way: steady is '
          'gmlp-bench\'s method (400 ms back to back, then the median of the timed calls), do_bench '
          'anchors.py\'s (triton: 25 ms, then 200 ms of calls, each after a 256 MB cache flush; '
          'gmlp-bench --method=do-bench). anchors.py: the torch figure of the tables above '
          '(do_bench; its own skewed split).\n')
    print('| product | sizes | shape | routing | libgmlp steady | torch steady | ratio | libgmlp do_bench | '
          'torch do_bench | ratio | torch (anchors.py) | goal |')
    print('|---|---|---|---|---|---|---|---|---|---|---|---|')
    for kind, op, anchor, title, goal in LIKE_FOR_LIKE:
        for key, line in steady_lines.items():
            k, sizes, shape, skew, o = key
            if k != kind or o != op:
                continue
            ours = line.get('tflops')
            ours_db = dobench.get(key, {}).get('tflops')
            t = torch_steady.get((shape, skew), {})
            t_steady = t.get(anchor + '_steady_tflops')
            t_db = t.get(anchor + '_dobench_tflops')
            g = goal(shape)
            print('| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |' % (
                title, sizes, shape, 'skewed' if skew else 'balanced', f(ours), f(t_steady),
                ratio(ours, t_steady), f(ours_db), f(t_db), ratio(ours_db, t_db),
                f(torch.get((shape, skew), {}).get(anchor + '_tflops')),
                '≥ %.2f×' % g if g else '–'))
    print()


report_like_for_like()
