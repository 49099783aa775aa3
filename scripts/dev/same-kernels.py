#!/usr/bin/env python3
"""Whether two builds of the CUDA backend hold the same kernel code.

Here, without cuobjdump: finds the cubins embedded in each shared object
(kernels/cubin_elf.py, with pyelftools) and compares their sections,
leaving out debug information (the kernels are built with -lineinfo, so a
comment that moves a line changes those). A source change that should not
change the code (a refactor, a comment) can then be checked against the
backend that ran on the GPU:

    scripts/dev/same-kernels.py OLD.so NEW.so

Prints each cubin whose code differs and exits 1 if any does.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'kernels'))
from cubin_elf import sections  # noqa: E402


def cubins(path):
    """Each cubin's sections by name, debug information left out: (size,
    bytes), no bytes where a section holds none (SHT_NOBITS)."""
    data = open(path, 'rb').read()
    found = []
    for section in sections(data):
        while len(found) <= section.cubin:
            found.append({})
        if 'debug' not in section.name:
            content = b'' if section.type == 'SHT_NOBITS' else data[section.offset:section.offset + section.size]
            found[-1][section.name] = (section.size, content)
    return found


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    old, new = (cubins(path) for path in sys.argv[1:])
    if len(old) != len(new):
        print(f'{len(old)} cubins against {len(new)}')
        return 1
    differing = 0
    for i, (ca, cb) in enumerate(zip(old, new)):
        names = sorted(n for n in set(ca) | set(cb) if ca.get(n) != cb.get(n))
        if names:
            differing += 1
            print(f'cubin {i}: ' + ', '.join(names[:6]) + (' ...' if len(names) > 6 else ''))
    print(f'{len(old)} cubins, {differing} with different code')
    return 1 if differing else 0


if __name__ == '__main__':
    sys.exit(main())
