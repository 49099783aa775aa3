#!/usr/bin/env python3
"""Charts of gmlp-bench's JSON lines, beside the anchors of the same run.

    bench/plot.py [-o DIR] [--prefix P] FILE.jsonl...

Reads JSON lines (other lines are skipped) from every FILE: gmlp-bench's
("bench":"gmlp", "gmlp-mlp", "gmlp-moe") and the anchors' of the same run
(../shared/bench/anchors.py, cublas_anchor, bench/cublas_loop_steady.cu,
bench/torch_steady.py, bench/mlp_anchor.py, ../shared/bench/ep_anchor.py),
and writes PNG bar charts into DIR (default: the current directory):

    P{op}-{dtype}-{sizes}.png   TFLOP/s of libgmlp beside each anchor of that
                                operation, per shape and routing (one chart
                                per operation, dtype and place of the group
                                sizes: fprop-bf16-host.png, ...)
    P{mlp}.png                  a SwiGLU GroupedMLP step against torch's
    P{moe}.png                  the MoE layer's parts (ms) against ep_anchor.py
    P{host-us}.png              the host's µs per call of each libgmlp line

It prints the name of each file it writes. The figures are drawn with
matplotlib's Agg backend: no display is needed.

SPDX-License-Identifier: LGPL-2.1-or-later
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

# The anchors' TFLOP/s keys for each (operation, kind), kind being 'bf16' or
# 'fp8' (every FP8 recipe is held against torch's FP8 rowwise product), with
# the label each gets.
ANCHORS = {
    ('fprop', 'bf16'): [('cublas_loop1_tflops', 'cuBLAS loop'),
                        ('cublas_loop_steady_tflops', 'cuBLAS loop (steady)'),
                        ('cublas_loop4stream_tflops', 'cuBLAS 4 streams'),
                        ('cublas_grouped_batched_tflops', 'cublasGemmGroupedBatchedEx'),
                        ('grouped_fprop_tflops', 'torch._grouped_mm'),
                        ('grouped_fprop_steady_tflops', 'torch._grouped_mm (steady)')],
    ('wgrad', 'bf16'): [('loop_wgrad_tflops', 'torch loop'),
                        ('grouped_wgrad_tflops', 'torch._grouped_mm'),
                        ('grouped_wgrad_steady_tflops', 'torch._grouped_mm (steady)')],
    ('fprop', 'fp8'): [('fp8_grouped_fprop_tflops', 'torch._scaled_grouped_mm'),
                       ('fp8_grouped_fprop_steady_tflops', 'torch._scaled_grouped_mm (steady)')],
}
LIBGMLP_COLOR = '#222222'   # the anchors take matplotlib's default colours


def read_lines(paths):
    records = []
    for path in paths:
        with open(path, encoding='utf-8') as f:
            for line in f:
                line = line.strip()
                if not line.startswith('{'):
                    continue
                try:
                    records.append(json.loads(line))
                except ValueError:
                    pass
    return records


def routing(skew):
    return 'skewed' if skew else 'balanced'


def bars(groups, series, title, ylabel, path):
    """A grouped bar chart: groups along x, one bar per series in each.
    series: [(label, {group: value}, colour or None)]; a missing value is
    no bar."""
    series = [s for s in series if any(v is not None for v in s[1].values())]
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(min(16.0, max(6.0, 1.2 + 0.3 * len(groups) * max(len(series), 1))), 4.5))
    for i, (label, values, color) in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ys = [values.get(g) for g in groups]
        kept = [(x, y) for x, y in zip(xs, ys) if y is not None]
        ax.bar([x for x, _ in kept], [y for _, y in kept], width, label=label, color=color)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(['\n'.join(g) if isinstance(g, tuple) else str(g) for g in groups], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis='y', alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(path)


def products(records, out, prefix):
    """One chart per (op, dtype, sizes) of the "gmlp" lines (the steady
    method), each anchor that times that product beside libgmlp."""
    anchors = {}
    for r in records:
        if 'shape' in r and 'skew' in r and not str(r.get('bench', '')).startswith('gmlp'):
            anchors.setdefault((r['shape'], bool(r['skew'])), {}).update(
                {k: v for k, v in r.items() if k.endswith('_tflops')})
    charts = {}
    for r in records:
        if r.get('bench') != 'gmlp' or r.get('method', 'steady') != 'steady' or r.get('tflops') is None:
            continue
        dtype = r.get('dtype', 'bf16')
        if r.get('quantize') == 'outside':
            dtype += '-quantized'
        key = (r['op'], dtype, r.get('sizes', 'host'))
        charts.setdefault(key, {})[(r['shape'], routing(r['skew']))] = r['tflops']
    written = []
    for (op, dtype, sizes), ours in sorted(charts.items()):
        groups = list(ours)
        device = next((r.get('device') for r in records if r.get('bench') == 'gmlp'), None)
        series = [('libgmlp', ours, LIBGMLP_COLOR)]
        for key, label in ANCHORS.get((op, 'fp8' if dtype.startswith('fp8') else 'bf16'), []):
            series.append((label, {g: anchors.get((g[0], g[1] == 'skewed'), {}).get(key) for g in groups}, None))
        path = os.path.join(out, '%s%s-%s-%s.png' % (prefix, op, dtype, sizes))
        bars(groups, series, '%s, %s, group sizes on the %s%s' % (op, dtype, sizes, ' — ' + device if device else ''),
             'TFLOP/s', path)
        written.append(path)
    return written


def mlp(records, out, prefix):
    ours = {(r['shape'], routing(r['skew'])): r.get('tflops') for r in records if r.get('bench') == 'gmlp-mlp'}
    if not ours:
        return []
    torch = {(r['shape'], routing(r['skew'])): r.get('tflops') for r in records if r.get('bench') == 'torch-mlp'}
    path = os.path.join(out, prefix + 'mlp.png')
    bars(list(ours), [('libgmlp GroupedMLP', ours, LIBGMLP_COLOR), ('torch._grouped_mm MLP', torch, None)],
         'SwiGLU grouped MLP, forward + backward, BF16', 'TFLOP/s', path)
    return [path]


def moe(records, out, prefix):
    parts = {r['part']: r for r in records if r.get('bench') == 'gmlp-moe' and 'part' in r}
    if not parts:
        return []
    anchor = next((r for r in records if r.get('bench') == 'ep-anchor' and r.get('world', 1) == 1), {})
    groups = ['step', 'forward', 'experts', 'permute', 'combine']
    ours = {'step': parts.get('layer', {}).get('ms'), 'forward': parts.get('layer', {}).get('fwd_ms'),
            'experts': parts.get('experts', {}).get('ms'), 'permute': parts.get('permute', {}).get('ms'),
            'combine': parts.get('combine', {}).get('ms')}
    series = [('libgmlp MoE layer', ours, LIBGMLP_COLOR)]
    graph = parts.get('layer', {}).get('graph_ms')
    if graph is not None:
        series.append(('libgmlp, graph replay', {'step': graph}, '#e67e22'))
    series.append(('PyTorch (ep_anchor.py)', {'step': anchor.get('step_ms'), 'forward': anchor.get('fwd_ms')}, None))
    layer = parts.get('layer', parts[next(iter(parts))])
    path = os.path.join(out, prefix + 'moe.png')
    bars(groups, series, 'MoE layer, %s tokens, %s experts, top-%s, hidden %s, ffn %s' % (
        layer.get('tokens'), layer.get('experts'), layer.get('topk'), layer.get('hidden'), layer.get('ffn')),
        'ms per call', path)
    return [path]


def host_time(records, out, prefix):
    """Host µs per call of every libgmlp line, one horizontal bar each,
    coloured by what was timed."""
    rows = []
    for r in records:
        bench = r.get('bench', '')
        if not bench.startswith('gmlp') or r.get('host_us') is None:
            continue
        if bench == 'gmlp':
            what = '%s %s' % (r['op'], r.get('dtype', 'bf16'))
            where = '%s %s, %s sizes' % (r['shape'], routing(r['skew']), r.get('sizes', 'host'))
        elif bench == 'gmlp-moe':
            what = 'MoE %s' % r.get('part', '?')
            where = '%s tokens' % r.get('tokens')
        else:
            what = bench[5:]
            where = '%s %s' % (r.get('shape', ''), routing(r.get('skew')))
        rows.append((what, where, r['host_us']))
    if not rows:
        return []
    kinds = list(dict.fromkeys(what for what, _, _ in rows))
    colors = {k: plt.get_cmap('tab10')(i % 10) for i, k in enumerate(kinds)}
    fig, ax = plt.subplots(figsize=(8.0, 1.2 + 0.22 * len(rows)))
    ys = range(len(rows))[::-1]
    ax.barh(list(ys), [v for _, _, v in rows], color=[colors[w] for w, _, _ in rows])
    ax.set_yticks(list(ys))
    ax.set_yticklabels(['%s — %s' % (where, what) for what, where, _ in rows], fontsize=7)
    ax.set_xlabel('µs per call')
    ax.set_title('Host time per call (device idle)')
    ax.grid(axis='x', alpha=0.3)
    ax.set_axisbelow(True)
    fig.tight_layout()
    path = os.path.join(out, prefix + 'host-us.png')
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(path)
    return [path]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('files', nargs='+', metavar='FILE.jsonl')
    parser.add_argument('-o', '--output-dir', default='.')
    parser.add_argument('--prefix', default='', help='put before each file name')
    args = parser.parse_args(argv)
    records = read_lines(args.files)
    os.makedirs(args.output_dir, exist_ok=True)
    written = []
    for chart in (products, mlp, moe, host_time):
        written += chart(records, args.output_dir, args.prefix)
    if not written:
        sys.exit('plot.py: no gmlp-bench lines in %s' % ', '.join(args.files))
    return 0


if __name__ == '__main__':
    sys.exit(main())
