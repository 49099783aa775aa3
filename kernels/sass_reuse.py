#!/usr/bin/env python3
"""sass_reuse.py: compiles one Hopper kernel file with nvcc, then lets the
blockwise FP8 promotion read its scales from the operand cache.

    sass_reuse.py KERNELS NVCC NVCC-ARGS...   (nvcc's -o names the object)

The promotion of a wide blockwise tile is one straight run of 96 FFMAs,
acc = fma (part, scale, acc), sixteen in a row with the same scale. ptxas
13.0 makes every other one yield (let the warp scheduler switch warps), and
a yielding instruction cannot keep its scale in the operand cache for the
next, so that one reads three registers from a register file of two banks:
a conflict on every other FFMA (scripts/dev/ffma-banks.py counts 50 of 96).
Here, in each run of at least MIN_RUN FFMAs of the kernels whose mangled
name the regular expression KERNELS matches, an FFMA followed by another
that reads the same scale register (both unpredicated, the first not
overwriting it) no longer yields and marks the scale for reuse: what ptxas
itself emits where it does not yield. Conflicts fall to 8 of 96, and
blockwise FPROP runs faster (measured in the eighteenth session of the
measurement history: `git show 2165ca8:docs/performance.md`).

Hopper's 128-bit encoding, second word: bit 45 set means no yield, bits
58-61 are the operand slots' reuse flags (bit 59: slot b, FFMA's
multiplier). First word: opcode in bits 0-11 (0x223: FFMA with register
sources), predicate in bits 12-15 (7: always), Rd bits 16-23, Ra 24-31,
Rb 32-39. The object's device code must be uncompressed (--no-compress,
added here) for the cubin to be found; nothing else in the file changes.
"""
import os
import re
import struct
import subprocess
import sys

import cubin_elf
from cubin_elf import sections

FFMA = 0x223
ALWAYS = 0x7
NO_REGISTER = 255
NO_YIELD = 1 << 45
REUSE_B = 1 << 59
MIN_RUN = 64
MAX_GAP = 8


def opcode(data, at):
    return data[at] | (data[at + 1] & 0xf) << 8


def runs(data, offset, size, ops, min_run=MIN_RUN):
    """Offsets of the instructions in ops of each run of at least min_run
    of them, at most MAX_GAP other instructions apart."""
    run = []
    for at in range(offset, offset + size, 16):
        if opcode(data, at) in ops:
            if run and at - run[-1] > 16 * (MAX_GAP + 1):
                if len(run) >= min_run:
                    yield run
                run = []
            run.append(at)
    if len(run) >= min_run:
        yield run


def reuse_scales(data, offset, size):
    """Patches one kernel's promotion runs; returns how many FFMAs changed."""
    changed = 0
    for run in runs(data, offset, size, (FFMA,)):
        for at, following in zip(run, run[1:]):
            if following != at + 16:
                continue
            w0, w1 = struct.unpack_from('<QQ', data, at)
            v0 = struct.unpack_from('<Q', data, following)[0]
            rb = (w0 >> 32) & 0xff
            if ((w0 >> 12) & 0xf) != ALWAYS or ((v0 >> 12) & 0xf) != ALWAYS:
                continue
            if rb == NO_REGISTER or rb != (v0 >> 32) & 0xff or (w0 >> 16) & 0xff == rb:
                continue
            if w1 & NO_YIELD and w1 & REUSE_B:
                continue
            struct.pack_into('<Q', data, at + 8, w1 | NO_YIELD | REUSE_B)
            changed += 1
    return changed


def add_dependencies(depfile, paths):
    """Names paths among the object's dependencies in nvcc's depfile, so
    that an edit of this script or of cubin_elf.py rebuilds it."""
    text = open(depfile).read()
    colon = text.index(' : ') + 3
    open(depfile, 'w').write(text[:colon] + ' '.join(paths) + ' ' + text[colon:])


def main():
    if len(sys.argv) < 4 or '-o' not in sys.argv:
        sys.exit(__doc__)
    kernels = re.compile(sys.argv[1])
    command = sys.argv[2:] + ['--no-compress']
    output = command[command.index('-o') + 1]
    subprocess.run(command, check=True)
    if '-MF' in command:
        add_dependencies(command[command.index('-MF') + 1],
                         [os.path.abspath(__file__), os.path.abspath(cubin_elf.__file__)])
    data = bytearray(open(output, 'rb').read())
    matched = changed = 0
    for section in sections(data):
        if section.name.startswith('.text.') and kernels.search(section.name[6:]):
            matched += 1
            changed += reuse_scales(data, section.offset, section.size)
    if matched == 0:
        sys.exit('sass_reuse.py: no kernel in %s matches %s' % (output, sys.argv[1]))
    if changed == 0:
        print('sass_reuse.py: warning: no FFMA of %s given the operand cache (ptxas changed?)' % output,
              file=sys.stderr)
    open(output, 'wb').write(data)


if __name__ == '__main__':
    main()
