#!/usr/bin/env python3
"""Whether two builds of the CUDA backend hold the same kernel code.

Here, without cuobjdump: finds the sm_90 cubins embedded in each shared
object (ELF images of CUDA's OS ABI, 0x41) and compares their sections,
leaving out debug information (the kernels are built with -lineinfo, so a
comment that moves a line changes those). A source change that should not
change the code (a refactor, a comment) can then be checked against the
backend that ran on the GPU:

    scripts/dev/same-kernels.py OLD.so NEW.so

Prints each cubin whose code differs and exits 1 if any does.
"""
import re
import struct
import sys

from cubin_elf import sections

CUDA_ELF = b'\x7fELF\x02\x01\x01\x41'


def cubins(path):
    data = open(path, 'rb').read()
    for match in re.finditer(re.escape(CUDA_ELF), data):
        start = match.start()
        shoff, = struct.unpack_from('<Q', data, start + 0x28)
        entsize, count, _ = struct.unpack_from('<HHH', data, start + 0x3a)
        yield data[start:start + shoff + entsize * count]


def code(elf):
    return {name: elf[offset:offset + size] for name, offset, size in sections(elf) if 'debug' not in name}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    old, new = (list(cubins(path)) for path in sys.argv[1:])
    if len(old) != len(new):
        print(f'{len(old)} cubins against {len(new)}')
        return 1
    differing = 0
    for i, (a, b) in enumerate(zip(old, new)):
        ca, cb = code(a), code(b)
        names = sorted(n for n in set(ca) | set(cb) if ca.get(n) != cb.get(n))
        if names:
            differing += 1
            print(f'cubin {i}: ' + ', '.join(names[:6]) + (' ...' if len(names) > 6 else ''))
    print(f'{len(old)} cubins, {differing} with different code')
    return 1 if differing else 0


if __name__ == '__main__':
    sys.exit(main())
