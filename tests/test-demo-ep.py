#!/usr/bin/python3
"""gmlp-demo --ep, or examples/demo.py --ep, prints what the one-device demo prints.

    test-demo-ep.py GMLP-LAUNCH GMLP-DEMO
    test-demo-ep.py GMLP-LAUNCH PYTHON examples/demo.py

Runs the demo on one CPU and expert-parallel on two CPU ranks under
gmlp-launch --tag, with the same small arguments, and checks that:

- rank 0 alone writes, and nothing to stderr;
- the progress has the one-device run's format, line by line (the numbers
  aside), the header's and the summary's device aside;
- a group of one rank trains as one device: the same loss, aux loss,
  agreement and load at every step (the loss and aux loss, averaged over the
  ranks in float32, within a unit of the last digit printed);
- the demo --ep outside gmlp-launch fails with one line on stderr that
  says to start it with gmlp-launch, and --ep-mode without --ep fails.
"""
import os
import re
import subprocess
import sys

SMALL = ['--steps', '8', '--tokens', '256', '--hidden', '32', '--ffn', '48']
SMALL_PY = ['8']   # demo.py: the steps; its sizes are fixed


def fail(message, output=None):
    sys.exit('test-demo-ep: %s%s' % (message, '\n--- output:\n' + output if output else ''))


def run(argv, env, expect_rc=0):
    p = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != expect_rc and not (expect_rc is None and p.returncode != 0):
        fail('%s exited with %d' % (' '.join(argv), p.returncode), p.stdout + p.stderr)
    return p


def shape(line):
    """The line with its numbers as N and its runs of spaces as one (the
    numbers' fields are of a fixed width): its format."""
    return re.sub(r' +', ' ', re.sub(r'[-+]?\d+(\.\d+)?(e[-+]?\d+)?', 'N', line))


def step_numbers(output):
    """(loss, aux, agree, load) of each step line."""
    found = []
    for line in output.splitlines():
        line = re.sub(r'^\[\d+\] ', '', line)
        m = re.match(r'step +\d+ +loss (\S+) +aux (\S+) +agree (\S+) .* load (\S+)$', line)
        if m:
            found.append((float(m[1]), float(m[2]), float(m[3]), m[4]))
    return found


def main():
    launch, demo = sys.argv[1], sys.argv[2:]
    env = {k: v for k, v in os.environ.items() if not k.startswith('GMLP_') or k == 'GMLP_DEBUG'}
    python = demo[-1].endswith('.py')
    small = SMALL_PY if python else SMALL
    # The one-device run on the CPU: gmlp-demo's --device; demo.py's GMLP_DEVICE.
    one_device = demo + small if python else demo + ['--device', 'cpu'] + small

    one = run(one_device, dict(env, GMLP_DEVICE='cpu'))
    ep = run([launch, '-n', '2', '--devices', 'cpu', '--tag'] + demo + ['--ep'] + small, env)
    if one.stderr or ep.stderr:
        fail('something on stderr', one.stderr + ep.stderr)
    lines = ep.stdout.splitlines()
    if not lines or any(not line.startswith('[0] ') for line in lines):
        fail('a rank other than 0 printed', ep.stdout)
    lines = [line[4:] for line in lines]
    ones = one.stdout.splitlines()
    if len(lines) != len(ones):
        fail('%d lines expert-parallel, %d on one device' % (len(lines), len(ones)),
             one.stdout + ep.stdout)
    steps = 0
    for a, b in zip(ones, lines):
        if a.startswith('gmlp-demo: ') or a.startswith('summary: '):
            # The device and, in the header, the expert-parallel layout.
            if a.split(' on ')[0] != b.split(' on ')[0]:
                fail('%r is not like %r' % (b, a))
        elif shape(a) != shape(b):
            fail('%r is not like %r' % (b, a))
        steps += a.startswith('step ')
    if steps != 8:
        fail('%d step lines, not 8' % steps, one.stdout)

    # One rank: the one-device run.
    alone_rank = run([launch, '-n', '1', '--devices', 'cpu'] + demo + ['--ep'] + small, env)
    a, b = step_numbers(one.stdout), step_numbers(alone_rank.stdout)
    if len(a) != 8 or len(b) != 8:
        fail('%d and %d step lines, not 8' % (len(a), len(b)), one.stdout + alone_rank.stdout)
    for n, (x, y) in enumerate(zip(a, b)):
        if any(abs(u - v) > 1.5e-6 for u, v in zip(x[:2], y[:2])) or x[2:] != y[2:]:
            fail('step %d on one rank: %s, on one device: %s' % (n + 1, y, x))

    # Outside the launcher: one line, naming it.
    alone = run(demo + ['--ep'] + small, env, expect_rc=None)
    if alone.stdout or len(alone.stderr.splitlines()) != 1 or 'gmlp-launch' not in alone.stderr:
        fail('the demo --ep outside gmlp-launch should fail with one line naming it',
             alone.stdout + alone.stderr)
    # --ep-mode alone: refused before anything runs.
    mode_alone = run(demo + ['--ep-mode', 'graph-safe'] + small, env, expect_rc=None)
    if mode_alone.stdout or '--ep' not in mode_alone.stderr:
        fail('the demo --ep-mode without --ep should fail naming --ep', mode_alone.stdout + mode_alone.stderr)
    print('ok: %d lines of the same format; --ep alone: %s' % (len(lines), alone.stderr.strip()))
    return 0


if __name__ == '__main__':
    sys.exit(main())
