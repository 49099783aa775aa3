#!/usr/bin/env python3
# Table of gmlp-bench --mlp against bench/mlp_anchor.py from the same run.
#
#   compare_mlp.py GMLP.jsonl TORCH.jsonl
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import json
import sys


def lines(path):
    out = []
    for line in open(path):
        if line.startswith('{'):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


ours = {(r['shape'], bool(r['skew'])): r for r in lines(sys.argv[1]) if r.get('bench') == 'gmlp-mlp'}
torch = {(r['shape'], bool(r['skew'])): r for r in lines(sys.argv[2]) if r.get('bench') == 'torch-mlp'}

print('### GroupedMLP step (SwiGLU, forward + backward), BF16, TFLOP/s\n')
print('| shape | routing | libgmlp | torch._grouped_mm + F.silu | ratio | libgmlp host µs |')
print('|---|---|---|---|---|---|')
for key, r in ours.items():
    t = torch.get(key, {})
    tt = t.get('tflops')
    print('| %s | %s | %.0f | %s | %s | %.0f |' % (
        key[0], 'skewed' if key[1] else 'balanced', r['tflops'],
        '%.0f' % tt if tt else t.get('error', '–')[:40],
        '%.2f×' % (r['tflops'] / tt) if tt else '–', r['host_us']))
