#!/usr/bin/env python3
"""A table of gmlp-bench lines tagged by build, for comparing backends.

On the GPU host, each gmlp-bench run's JSON lines prefixed with a tag (the
backend's name, scripts/dev/pack-alt.sh):

    GMLP_BACKEND_DIR=$(gmlp_alt_dir new) gmlp-bench ... | sed 's/^/new /' >> bench.txt

Then, here or there:

    scripts/dev/bench-table.py bench.txt [TAG,TAG...]

prints one row per shape, routing, dtype and operation, with each tag's
TFLOP/s in the order given (default: as first seen), every run of a tag
separated by slashes.
"""
import collections
import json
import sys


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    runs = collections.defaultdict(list)
    rows, tags = [], []
    for line in open(sys.argv[1]):
        tag, _, rest = line.partition(' ')
        try:
            r = json.loads(rest)
        except ValueError:
            continue
        if r.get('bench') != 'gmlp':
            continue
        key = (r['shape'], 'skewed' if r.get('skew') else 'balanced', r['dtype'], r['op'])
        if key not in rows:
            rows.append(key)
        if tag not in tags:
            tags.append(tag)
        runs[key + (tag,)].append(r['tflops'])
    if len(sys.argv) == 3:
        tags = sys.argv[2].split(',')
    print('| shape | routing | dtype | op | ' + ' | '.join(tags) + ' |')
    print('|---' * (4 + len(tags)) + '|')
    for key in rows:
        cells = [' / '.join(f'{v:.0f}' for v in runs[key + (t,)]) or '-' for t in tags]
        print('| ' + ' | '.join(key) + ' | ' + ' | '.join(cells) + ' |')


if __name__ == '__main__':
    sys.exit(main())
