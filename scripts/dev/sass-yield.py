#!/usr/bin/env python3
"""Report, or set, the yield flags of the FP8 promotions in sm_90 code.

Reads every CUDA ELF (cubin) embedded in FILE (a cubin, an object, a shared
library) and, in the kernels whose name NAME (a regular expression) matches, finds the runs of the
promotion: 32 or more FADD or FFMA (opcodes 0x221, 0x223) with at most
8 other instructions between two of them. Hopper encodes each 128-bit
instruction's scheduling in its second word: bit 45 clear lets the warp
scheduler switch to another warp after it (yield), bits 58-61 keep its
sources in the operand cache for the next instruction (reuse). A run
that ptxas left without yields holds the scheduler on one warp for its
length, while the other consumer's wgmma waits to be issued.

With --write, every other instruction of each 16 of a run that has no
yield is made to yield, and loses its reuse flags: after a switch the
operand cache holds another warp's values, so the next instruction reads
its sources from the register file instead. Nothing else changes: the
file's size and every other byte stay as they were.

    scripts/dev/sass-yield.py FILE [NAME] [--write] [-v]
"""
import re
import struct
import sys

EM_CUDA = 190
PROMOTION_OPS = (0x221, 0x223)    # FADD, FFMA (register forms)
NO_YIELD = 1 << 45
REUSE = 0xf << 58
MIN_RUN = 32
MAX_GAP = 8
CHUNK = 16


def cuda_elfs(data):
    """Offsets of the cubins in data."""
    at = data.find(b'\x7fELF')
    while at >= 0:
        if struct.unpack_from('<H', data, at + 18)[0] == EM_CUDA:
            yield at
        at = data.find(b'\x7fELF', at + 1)


def text_sections(data, elf):
    shoff, = struct.unpack_from('<Q', data, elf + 0x28)
    entsize, count, names = struct.unpack_from('<HHH', data, elf + 0x3a)
    headers = [struct.unpack_from('<IIQQQQ', data, elf + shoff + i * entsize) for i in range(count)]
    strings = elf + headers[names][4]
    for name, _, _, _, offset, size in headers:
        end = data.index(b'\0', strings + name)
        label = data[strings + name:end].decode()
        if label.startswith('.text.'):
            yield label[6:], elf + offset, size


def runs(data, offset, size):
    """(first, last) instruction offsets of each promotion run."""
    first = last = None
    count = 0
    for at in range(offset, offset + size, 16):
        if data[at] | (data[at + 1] & 0xf) << 8 not in PROMOTION_OPS:
            if last is not None and at - last > 16 * MAX_GAP:
                if count >= MIN_RUN:
                    yield first, last
                first = last = None
                count = 0
            continue
        if first is None:
            first = at
        last = at
        count += 1
    if count >= MIN_RUN:
        yield first, last


def promotion_ops(data, first, last):
    for at in range(first, last + 16, 16):
        if data[at] | (data[at + 1] & 0xf) << 8 in PROMOTION_OPS:
            yield at


def main():
    args = [a for a in sys.argv[1:] if not a.startswith('-')]
    write = '--write' in sys.argv
    verbose = '-v' in sys.argv
    if not args:
        sys.exit(__doc__)
    data = bytearray(open(args[0], 'rb').read())
    want = args[1] if len(args) > 1 else ''
    changed = 0
    for elf in cuda_elfs(data):
        for name, offset, size in text_sections(data, elf):
            if not re.search(want, name):
                continue
            for first, last in runs(data, offset, size):
                ops = list(promotion_ops(data, first, last))
                words = [struct.unpack_from('<Q', data, at + 8)[0] for at in ops]
                yields = sum(1 for w in words if not w & NO_YIELD)
                # Runs merge where promotions follow one another: judged
                # CHUNK instructions at a time.
                chunks = [range(c, min(c + CHUNK, len(ops))) for c in range(0, len(ops), CHUNK)]
                bare = [c for c in chunks if all(words[i] & NO_YIELD for i in c)]
                if verbose or bare:
                    print('%s: run of %d at 0x%x, %d yield, %d of %d chunks without%s' %
                          (name, len(ops), first - offset, yields, len(bare), len(chunks),
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
