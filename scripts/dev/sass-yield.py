#!/usr/bin/env python3
"""Report, or set, the yield flags of the FP8 promotions in sm_90 code.

Reads every CUDA ELF (cubin) embedded in FILE (a cubin, an object, a shared
library) and, in the kernels whose name NAME (a regular expression)
matches, finds the runs of the promotion: 32 or more FADD or FFMA
(opcodes 0x221, 0x223) with at most 8 other instructions between two of
them. Hopper encodes each 128-bit instruction's scheduling in its second
word: bit 45 clear lets the warp scheduler switch to another warp after it
(yield), bits 58-61 keep its sources in the operand cache for the next
instruction (reuse); kernels/sass_reuse.py, which the build runs on the
blockwise instances, has the rest of the encoding.

With --write, every other instruction of each 16 of a run that has no
yield is made to yield, and loses its reuse flags (after a switch the
operand cache holds another warp's values). That was an experiment
(nothing gained: the eighteenth session of
`git show 2165ca8:docs/performance.md`); the file's size and every other
byte stay as they were.

    scripts/dev/sass-yield.py FILE [NAME] [--write] [-v]
"""
import os
import re
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'kernels'))
from cubin_elf import sections  # noqa: E402
from sass_reuse import NO_YIELD, runs  # noqa: E402

PROMOTION_OPS = (0x221, 0x223)    # FADD, FFMA (register forms)
REUSE = 0xf << 58
CHUNK = 16


def main():
    args = [a for a in sys.argv[1:] if not a.startswith('-')]
    write = '--write' in sys.argv
    verbose = '-v' in sys.argv
    if not args:
        sys.exit(__doc__)
    data = bytearray(open(args[0], 'rb').read())
    want = args[1] if len(args) > 1 else ''
    changed = 0
    for section in sections(data):
        name, offset, size = section.name[6:], section.offset, section.size
        if section.name.startswith('.text.') and re.search(want, name):
            for ops in runs(data, offset, size, PROMOTION_OPS, 32):
                words = [struct.unpack_from('<Q', data, at + 8)[0] for at in ops]
                yields = sum(1 for w in words if not w & NO_YIELD)
                # Runs merge where promotions follow one another: judged
                # CHUNK instructions at a time.
                chunks = [range(c, min(c + CHUNK, len(ops))) for c in range(0, len(ops), CHUNK)]
                bare = [c for c in chunks if all(words[i] & NO_YIELD for i in c)]
                if verbose or bare:
                    print('%s: run of %d at 0x%x, %d yield, %d of %d chunks without%s' %
                          (name, len(ops), ops[0] - offset, yields, len(bare), len(chunks),
                           ', patched' if bare and write else ''))
                if not write:
                    continue
                for c in bare:
                    for i in c:
                        if i % 2 == 1:
                            struct.pack_into('<Q', data, ops[i] + 8, words[i] & ~(NO_YIELD | REUSE))
                            changed += 1
    if write:
        open(args[0], 'wb').write(data)
        print('%d instructions made to yield' % changed)


if __name__ == '__main__':
    main()
