#!/usr/bin/env python3
"""test-sass-rewrite.py: the file that kernels/sass_reuse.py rewrites,
compiled both ways the build may compile it (meson option sass-rewrite).

    test-sass-rewrite.py KERNELS SOURCE NVCC NVCC-ARGS...

Plain nvcc (the fall-back wherever the rewrite was not verified) and nvcc
through sass_reuse.py each give a host object that defines the kernels whose
mangled name the expression KERNELS matches, with their sm_90a code; the
rewritten object's cubin holds those kernels' code, and with a release in
sass_reuse.VERIFIED the rewrite changed some of their FFMAs. Where plain
nvcc left its device code uncompressed, the two cubins differ in nothing but
those FFMAs' yield and reuse bits. Nothing runs on
a GPU (the kernel tests, suite gpu, do that). Skips (77) where nvcc or
pyelftools is missing.
"""
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

KERNELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'kernels')
sys.path.insert(0, KERNELS_DIR)

try:
    from elftools.elf.elffile import ELFFile
except ImportError:
    print('1..0 # SKIP pyelftools is not installed')
    sys.exit(0)

import cubin_elf  # noqa: E402
import sass_reuse  # noqa: E402

checks = 0


def ok(condition, what):
    global checks
    checks += 1
    print('%sok %d - %s' % ('' if condition else 'not ', checks, what))
    if not condition:
        print('1..%d' % checks)
        sys.exit(1)


def host_kernels(path, kernels):
    """What kernels matches in the names of the functions the host object at
    path defines (a kernel's launch function has the kernel's name, with
    internal linkage), or None if it is no x86-64 relocatable object."""
    with open(path, 'rb') as f:
        elf = ELFFile(f)
        if elf['e_type'] != 'ET_REL' or elf['e_machine'] != 'EM_X86_64':
            return None
        symtab = elf.get_section_by_name('.symtab')
        return {kernels.search(s.name).group(0) for s in symtab.iter_symbols()
                if s['st_info']['type'] == 'STT_FUNC' and s['st_shndx'] != 'SHN_UNDEF'
                and kernels.search(s.name)}


def same_but_reuse(plain, rewritten, kernels):
    """Whether the cubins of two objects have the same sections with the
    same bytes, but for FFMAs of the kernels that kernels matches whose
    second word gained sass_reuse.py's no-yield and reuse bits."""
    ours = list(cubin_elf.sections(rewritten))
    theirs = list(cubin_elf.sections(plain))
    if [(s.name, s.size) for s in ours] != [(s.name, s.size) for s in theirs]:
        return False
    bits = sass_reuse.NO_YIELD | sass_reuse.REUSE_B
    changed = 0
    for a, b in zip(theirs, ours):
        # .debug_str names nvcc's temporary files, different every run.
        if a.type == 'SHT_NOBITS' or a.name == '.debug_str':
            continue
        x, y = plain[a.offset:a.offset + a.size], rewritten[b.offset:b.offset + b.size]
        if x == y:
            continue
        if not (a.name.startswith('.text.') and kernels.search(a.name)):
            print('# %s differs' % a.name)
            return False
        for at in range(0, a.size, 16):
            w0, w1 = struct.unpack_from('<QQ', x, at)
            v0, v1 = struct.unpack_from('<QQ', y, at)
            if (w0, w1) == (v0, v1):
                continue
            if w0 != v0 or sass_reuse.opcode(x, at) != sass_reuse.FFMA or v1 != w1 | bits:
                print('# %s: instruction %d differs otherwise' % (a.name, at // 16))
                return False
            changed += 1
    print('# %d FFMAs rewritten' % changed)
    return True


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    kernels = re.compile(sys.argv[1])
    source, nvcc, args = sys.argv[2], sys.argv[3], sys.argv[4:]
    if not shutil.which(nvcc):
        print('1..0 # SKIP nvcc is not here')
        return
    release = sass_reuse.nvcc_release(nvcc)
    print('# nvcc %s, %s' % (release, 'verified' if release in sass_reuse.VERIFIED else 'not verified'))
    with tempfile.TemporaryDirectory() as tmp:
        plain = os.path.join(tmp, 'plain.o')
        rewritten = os.path.join(tmp, 'rewritten.o')
        subprocess.run([nvcc] + args + ['-c', source, '-o', plain], check=True)
        names = host_kernels(plain, kernels)
        ok(names is not None, 'plain nvcc: an x86-64 relocatable object')
        ok(len(names) > 0, 'plain nvcc: it defines the kernels (%d)' % len(names))

        run = subprocess.run([sys.executable, os.path.join(KERNELS_DIR, 'sass_reuse.py'),
                              sys.argv[1], nvcc] + args + ['-c', source, '-o', rewritten],
                             stderr=subprocess.PIPE, text=True)
        sys.stderr.write(run.stderr)
        ok(run.returncode == 0, 'sass_reuse.py: exit status 0')
        ok(host_kernels(rewritten, kernels) == names, 'sass_reuse.py: the same kernels as plain nvcc')
        with open(rewritten, 'rb') as f:
            data = f.read()
        code = {kernels.search(s.name).group(0) for s in cubin_elf.sections(data)
                if s.name.startswith('.text.') and kernels.search(s.name)}
        ok(code == names, 'sass_reuse.py: the cubin holds their code')
        if release in sass_reuse.VERIFIED:
            ok('warning' not in run.stderr, 'sass_reuse.py: FFMAs given the operand cache')
        with open(plain, 'rb') as f:
            plain_data = f.read()
        if any(True for _ in cubin_elf.sections(plain_data)):
            ok(same_but_reuse(plain_data, data, kernels),
               'the cubins differ only in the rewritten FFMAs\' yield and reuse bits')
        else:
            print('# plain nvcc compressed its device code: not compared')
    print('1..%d' % checks)


if __name__ == '__main__':
    main()
