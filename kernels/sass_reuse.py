#!/usr/bin/env python3
"""sass_reuse.py: compiles one Hopper kernel file with nvcc, then lets the
blockwise FP8 promotion read its scales from the operand cache.

    sass_reuse.py KERNELS NVCC NVCC-ARGS...   (nvcc's -o names the object)
    sass_reuse.py --verified NVCC             (prints NVCC's release; fails
                                               unless it is in VERIFIED)

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

The rewrite reads code that ptxas chose, so the build runs it only with an
nvcc release in VERIFIED (meson option sass-rewrite, auto by default: on any
other release the file is compiled by plain nvcc like the other Hopper
instances; tests/kernels/test-sass-rewrite.py compiles it both ways). A
release joins VERIFIED once, in a build with it, scripts/dev/ffma-banks.py
finds the conflicts fallen and the kernel tests (tests/kernels, suite gpu)
pass on an H100 or H200.
"""
import os
import re
import struct
import subprocess
import sys

# The nvcc releases (as --version names them) the rewrite was verified with.
VERIFIED = ('13.0.88',)

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


def nvcc_release(nvcc):
    """NVCC's release, as in its --version's "V13.0.88"; None if not found."""
    text = subprocess.run([nvcc, '--version'], capture_output=True, text=True, check=True).stdout
    found = re.search(r'^Cuda compilation tools, release .*, V([0-9.]+)$', text, re.M)
    return found.group(1) if found else None


def rewrite(path, kernels):
    """Patches the kernels whose name the compiled expression kernels
    matches in the object at path; returns (kernels matched, FFMAs changed)."""
    from cubin_elf import sections

    data = bytearray(open(path, 'rb').read())
    matched = changed = 0
    for section in sections(data):
        if section.name.startswith('.text.') and kernels.search(section.name[6:]):
            matched += 1
            changed += reuse_scales(data, section.offset, section.size)
    open(path, 'wb').write(data)
    return matched, changed


def add_dependencies(depfile, paths):
    """Names paths among the object's dependencies in nvcc's depfile, so
    that an edit of this script or of cubin_elf.py rebuilds it."""
    text = open(depfile).read()
    colon = text.index(' : ') + 3
    open(depfile, 'w').write(text[:colon] + ' '.join(paths) + ' ' + text[colon:])


def main():
    if len(sys.argv) == 3 and sys.argv[1] == '--verified':
        release = nvcc_release(sys.argv[2])
        print(release or 'unknown', end='')
        sys.exit(0 if release in VERIFIED else 1)
    if len(sys.argv) < 4 or '-o' not in sys.argv:
        sys.exit(__doc__)
    kernels = re.compile(sys.argv[1])
    command = sys.argv[2:] + ['--no-compress']
    output = command[command.index('-o') + 1]
    subprocess.run(command, check=True)
    if '-MF' in command:
        here = os.path.dirname(os.path.abspath(__file__))
        add_dependencies(command[command.index('-MF') + 1],
                         [os.path.abspath(__file__), os.path.join(here, 'cubin_elf.py')])
    matched, changed = rewrite(output, kernels)
    if matched == 0:
        sys.exit('sass_reuse.py: no kernel in %s matches %s' % (output, sys.argv[1]))
    if changed == 0:
        print('sass_reuse.py: warning: no FFMA of %s given the operand cache (ptxas changed?)' % output,
              file=sys.stderr)


if __name__ == '__main__':
    main()
