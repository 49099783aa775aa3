#!/usr/bin/env python3
"""Register-bank report of the FFMAs of the kernels in an sm_90 cubin.

Here, without cuobjdump: compile one kernel file to a cubin and read its
FFMA encodings (FFMA R, R, R, R: opcode 0x223; Rd bits 16-23, Ra 24-31,
Rb 32-39 of the first word, Rc bits 0-7 of the second, the operand-cache
"reuse" flags bits 58-60). With two register banks (even and odd
registers), an FFMA that reads two of its sources from one bank waits a
cycle; a source that the previous FFMA marked for reuse in the same slot
comes from the operand cache instead. The fifteenth session of the
measurement history (`git show 2165ca8:docs/performance.md`) has what
this found in the blockwise promotion.

    nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -Ikernels \\
         -Ibuild/kernels -cubin -o /tmp/k.cubin kernels/grouped_gemm_sm90_fp8_blocks.cu
    scripts/dev/ffma-banks.py /tmp/k.cubin [NAME-SUBSTRING] [-v]
"""
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'kernels'))
from cubin_elf import sections  # noqa: E402

FFMA = 0x223
NO_REGISTER = 255


def report(elf, offset, size, verbose):
    """(FFMAs, FFMAs with two register-file reads in one bank)."""
    total = conflicts = 0
    previous = None   # (sources, reuse flags) of the instruction before, if an FFMA
    for at in range(offset, offset + size, 16):
        w0, w1 = struct.unpack_from('<QQ', elf, at)
        if w0 & 0xfff != FFMA:
            previous = None
            continue
        rd = (w0 >> 16) & 0xff
        sources = ((w0 >> 24) & 0xff, (w0 >> 32) & 0xff, w1 & 0xff)
        reuse = (w1 >> 58) & 0x7
        read = [r for slot, r in enumerate(sources)
                if r != NO_REGISTER and not (previous and (previous[1] >> slot) & 1 and previous[0][slot] == r)]
        parities = [r % 2 for r in read]
        clash = len(parities) != len(set(parities))
        total += 1
        conflicts += clash
        if verbose:
            marks = ['R%d%s' % (r, '.reuse' if (reuse >> s) & 1 else '') for s, r in enumerate(sources)]
            print('  FFMA R%d, %s%s' % (rd, ', '.join(marks), '   <- bank conflict' if clash else ''))
        previous = (sources, reuse)
    return total, conflicts


def main():
    args = [a for a in sys.argv[1:] if a != '-v']
    if not args:
        sys.exit(__doc__)
    elf = open(args[0], 'rb').read()
    want = args[1] if len(args) > 1 else ''
    for section in sections(elf):
        if section.name.startswith('.text.') and want in section.name:
            total, conflicts = report(elf, section.offset, section.size, '-v' in sys.argv)
            print('%s: %d FFMA, %d read two registers of one bank' % (section.name[6:], total, conflicts))


if __name__ == '__main__':
    main()
