#!/usr/bin/env python3
"""Summarises a scripts/dev/kernel-timeline.c record file: per kernel name
the count and median duration; gaps between consecutive device operations
(any stream, under 200 µs, so idle periods drop out), by pair of names.

    python3 scripts/dev/kernel-timeline-summary.py kt.txt [SKIP]

SPDX-License-Identifier: LGPL-2.1-or-later
"""
import sys, collections, statistics
recs = []
for line in open(sys.argv[1]):
    f = line.split(None, 7)
    if f[0] == 'K':
        recs.append((int(f[1]), int(f[2]), 'K', f[7].strip()[:60], int(f[4])))
    elif f[0] == 'C':
        recs.append((int(f[1]), int(f[2]), 'C', 'memcpy kind %s %s B' % (f[5], f[4]), 0))
    elif f[0] == 'S':
        recs.append((int(f[1]), int(f[2]), 'S', 'memset %s B' % f[4], 0))
recs.sort()
skip = int(sys.argv[2]) if len(sys.argv) > 2 else 0
recs = recs[skip:]
dur = collections.defaultdict(list)
gap = collections.defaultdict(list)
for i, r in enumerate(recs):
    dur[(r[3], r[4])].append((r[1] - r[0]) / 1000)
    if i:
        p = recs[i - 1]
        g = (r[0] - p[1]) / 1000
        if g < 200:   # ignore idle periods (syncs, rests)
            gap[(p[3][:30], r[3][:30])].append(g)
print('%-62s %6s %5s %10s' % ('kernel', 'grid', 'n', 'median us'))
for k, v in sorted(dur.items(), key=lambda kv: -sum(kv[1])):
    print('%-62s %6d %5d %10.2f' % (k[0], k[1], len(v), statistics.median(v)))
print('gaps (<200 us) prev -> next: n, median, mean us')
for k, v in sorted(gap.items(), key=lambda kv: -sum(kv[1])):
    print('%-31s -> %-31s %5d %8.2f %8.2f' % (k[0], k[1], len(v), statistics.median(v), statistics.mean(v)))
