#!/usr/bin/python3
# gmlp-demo-plot: the PNG of a gmlp-demo run, from its JSON lines
# (gmlp-demo --json FILE): the loss and the routing agreement over the
# steps above, the tokens each expert of the student got below (a line per
# expert, with the teacher's dotted, up to 10 experts; a heat map beyond).
# gmlp-demo --plot runs it; it needs matplotlib (Debian: python3-matplotlib).
#
#   gmlp-demo-plot STEPS.jsonl OUT.png
#   gmlp-demo-plot --check          # exits 0 when matplotlib can plot
#
# SPDX-License-Identifier: LGPL-2.1-or-later

import json
import sys


def pyplot():
    try:
        import matplotlib
        matplotlib.use('Agg')   # files only, no display
        import matplotlib.pyplot as plt
    except ImportError as e:
        sys.exit('gmlp-demo-plot: %s: install python3-matplotlib (scripts/install-deps.sh does)' % e)
    return plt


def read(path):
    header, steps = {}, []
    with open(path, encoding='utf-8') as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except ValueError as e:
                sys.exit('gmlp-demo-plot: %s:%d: %s' % (path, number, e))
            if 'step' in record:
                steps.append(record)
            else:
                header = record
    if not steps:
        sys.exit('gmlp-demo-plot: %s has no steps' % path)
    n_experts = len(steps[0]['load'])
    if any(len(s['load']) != n_experts or len(s['teacher_load']) != n_experts for s in steps):
        sys.exit('gmlp-demo-plot: %s: the steps do not have the same number of experts' % path)
    return header, steps


def plot(header, steps, out):
    plt = pyplot()
    x = [s['step'] for s in steps]
    n_experts = len(steps[0]['load'])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)

    top.plot(x, [s['loss'] for s in steps], color='C0', label='loss')
    top.set_yscale('log')
    top.set_ylabel('loss (log scale)', color='C0')
    right = top.twinx()
    right.plot(x, [s['agreement'] for s in steps], color='C3', label='routing agreement')
    if header.get('top_k') and header.get('experts'):
        right.axhline(header['top_k'] / header['experts'], color='C3', linestyle=':', linewidth=1,
                      label='chance')
    right.set_ylim(0, 1)
    right.set_ylabel('routing agreement', color='C3')
    lines = top.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    top.legend(lines[0] + more[0], lines[1] + more[1], loc='center right', fontsize='small')

    if n_experts <= 10:
        for e in range(n_experts):
            bottom.plot(x, [s['load'][e] for s in steps], color='C%d' % e, label='expert %d' % e)
            bottom.plot(x, [s['teacher_load'][e] for s in steps], color='C%d' % e, linestyle=':',
                        linewidth=1)
        bottom.legend(loc='upper left', fontsize='x-small', ncol=min(n_experts, 5),
                      title="student (teacher's dotted)", title_fontsize='x-small')
        bottom.set_ylabel('tokens per expert')
    else:
        grid = [[s['load'][e] for s in steps] for e in range(n_experts)]
        image = bottom.imshow(grid, aspect='auto', origin='lower', interpolation='nearest',
                              extent=(x[0] - 0.5, x[-1] + 0.5, -0.5, n_experts - 0.5))
        # Inset, so that both panels keep the same width and steps.
        fig.colorbar(image, cax=bottom.inset_axes([1.01, 0.0, 0.015, 1.0]), label='tokens')
        bottom.set_ylabel('expert')
    bottom.set_xlabel('step')

    title = 'gmlp-demo: a student MoE layer learns a teacher'
    if header:
        title += '\n%s, %s, %d experts, top-%d, %d tokens/step' % (
            header.get('device', '?'), header.get('dtype', '?'), header.get('experts', n_experts),
            header.get('top_k', 0), header.get('tokens', 0))
    fig.suptitle(title, fontsize='medium')
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main(argv):
    if argv[1:] == ['--check']:
        pyplot()
        return 0
    if len(argv) != 3:
        sys.exit('usage: gmlp-demo-plot STEPS.jsonl OUT.png | --check')
    header, steps = read(argv[1])
    plot(header, steps, argv[2])
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
