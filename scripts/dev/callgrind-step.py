#!/usr/bin/python3
"""Instructions per step of gmlp-host-step on the CPU, outside the backend.

    callgrind-step.py [--build build] [--what moe|mlp|router|linear] [--steps 20,60]
                      [-- gmlp-host-step ARGS]

Runs build/bench/gmlp-host-step under `valgrind --tool=callgrind` twice,
with two step counts, and prints the difference per step: all the
instructions, those inside the CPU backend's entries (the inclusive cost of
calls into a cpu_* or gmlp_cpu_* function from outside one: the arithmetic,
and the backend's allocations) and the rest, the host work of the library,
GLib and libc per step. The first steps, which load and allocate, cancel
out. --calls lists the calls into each backend entry per step (each is a
launch, or a library call, on CUDA). The default shape is tiny, so that the arithmetic stays small:
--tokens 16 --hidden 32 --ffn 16 --experts 4 --topk 2.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

TINY = ['--tokens', '16', '--hidden', '32', '--ffn', '16', '--experts', '4', '--topk', '2']


def is_backend(name):
    return name.startswith('cpu_') or name.startswith('gmlp_cpu_')


def read_profile(path):
    """(total, calls of each function, inclusive cost of calls into the backend,
    calls into each backend entry from outside the backend)."""
    names = {}
    total = 0
    calls = {}
    entries = {}
    backend = 0
    fn = cfn = None
    pending = None

    def resolve(spec):
        m = re.match(r'\((\d+)\)(?:\s+(.*))?$', spec)
        if not m:
            return spec
        if m.group(2) is not None:
            names[m.group(1)] = m.group(2)
        return names[m.group(1)]

    with open(path) as f:
        for line in f:
            if line.startswith(('totals:', 'summary:')):
                total = int(line.split()[1])
            elif line.startswith('fn='):
                fn = resolve(line[3:].rstrip('\n'))
            elif line.startswith('cfn='):
                cfn = resolve(line[4:].rstrip('\n'))
            elif line.startswith('calls='):
                pending = int(line[6:].split()[0])
            elif pending is not None and (line[:1].isdigit() or line[:1] in ('+', '-', '*')):
                # The line after calls=: the call's inclusive cost.
                parts = line.split()
                cost = int(parts[1]) if len(parts) > 1 else 0
                calls[cfn] = calls.get(cfn, 0) + pending
                if is_backend(cfn) and not is_backend(fn):
                    backend += cost
                    entries[cfn] = entries.get(cfn, 0) + pending
                pending = None
    return total, calls, backend, entries


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--build', default='build')
    parser.add_argument('--what', default='moe', choices=['moe', 'mlp', 'router', 'linear'])
    parser.add_argument('--steps', default='20,60')
    parser.add_argument('--calls', action='store_true', help='list the backend entries called per step')
    parser.add_argument('args', nargs='*', help='gmlp-host-step arguments (a tiny shape by default)')
    opts = parser.parse_args()
    few, many = (int(n) for n in opts.steps.split(','))
    args = opts.args or TINY
    env = dict(os.environ, GMLP_DEVICE='cpu', OPENBLAS_NUM_THREADS='1')
    # The steps are host_step_WHAT() but for linear's loop, which is inlined:
    # there the whole run counts, and one step is one call.
    step_fn = None if opts.what == 'linear' else 'host_step_' + opts.what
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (few, many):
            out = os.path.join(tmp, 'cg.%d' % n)
            cmd = ['valgrind', '--tool=callgrind', '--callgrind-out-file=' + out]
            if step_fn:
                cmd.append('--toggle-collect=' + step_fn)
            cmd += [os.path.join(opts.build, 'bench', 'gmlp-host-step'), '--what', opts.what,
                    '--steps', str(n)] + args
            subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            results.append(read_profile(out))
    (t0, c0, b0, e0), (t1, c1, b1, e1) = results
    steps = (c1.get(step_fn, 0) - c0.get(step_fn, 0)) if step_fn else many - few
    if steps <= 0:
        sys.exit('no steps between the two runs')
    total, backend = (t1 - t0) / steps, (b1 - b0) / steps
    print('%s: %d steps; per step %.0f instructions, %.0f in the backend, %.0f outside it'
          % (opts.what, steps, total, backend, total - backend))
    if opts.calls:
        per_step = {name: (e1.get(name, 0) - e0.get(name, 0)) / steps for name in e1}
        for name in sorted(per_step, key=lambda name: (-per_step[name], name)):
            if per_step[name] > 0:
                print('  %-40s %g' % (name, per_step[name]))
        print('  %-40s %g' % ('(all backend calls)', sum(per_step.values())))


if __name__ == '__main__':
    main()
