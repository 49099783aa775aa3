#!/usr/bin/python3
"""Names the stacks hostprof.so sampled and says where the host time went.

    hostprof-report.py PROF.txt --root op_moe_step [--exclude gmlp_device_synchronize]
                       [--lib DIR ...] [--top 50]

Only samples with a frame in --root count (the calls being measured), and
none with a frame in --exclude. Prints the time per call tree entry
(inclusive, each function once per sample), the library each sample was
in, and the external function each of our frames was calling. The
binaries must be the ones that ran: --lib names local directories to look
in for a mapped file's base name (a prebuilt tree carried to the GPU host).
"""

import argparse
import bisect
import collections
import os
import sys

from elftools.elf.elffile import ELFFile


class Module:
    def __init__(self, path):
        self.path = path
        self.loads = []
        self.addrs = []
        self.names = []
        try:
            with open(path, 'rb') as f:
                elf = ELFFile(f)
                for seg in elf.iter_segments():
                    if seg['p_type'] == 'PT_LOAD':
                        self.loads.append((seg['p_offset'], seg['p_vaddr'], seg['p_filesz']))
                symbols = {}
                for name in ('.symtab', '.dynsym'):
                    table = elf.get_section_by_name(name)
                    if table is None:
                        continue
                    for sym in table.iter_symbols():
                        if sym['st_info']['type'] == 'STT_FUNC' and sym['st_value']:
                            symbols.setdefault(sym['st_value'], sym.name)
                for addr in sorted(symbols):
                    self.addrs.append(addr)
                    self.names.append(symbols[addr])
        except Exception as e:  # a vdso, a missing file
            print('# %s: %s' % (path, e), file=sys.stderr)

    def name(self, file_offset):
        vaddr = file_offset
        for off, va, size in self.loads:
            if off <= file_offset < off + size:
                vaddr = file_offset - off + va
                break
        i = bisect.bisect_right(self.addrs, vaddr) - 1
        return self.names[i] if i >= 0 else '0x%x' % vaddr


def main():
    p = argparse.ArgumentParser()
    p.add_argument('prof')
    p.add_argument('--root', action='append', required=True)
    p.add_argument('--exclude', action='append', default=[])
    p.add_argument('--lib', action='append', default=[])
    p.add_argument('--ours', default='gmlp', help='a substring of our modules\' paths')
    p.add_argument('--calls', type=int, default=0, help='calls measured: print µs per call')
    p.add_argument('--top', type=int, default=50)
    p.add_argument('--callers', help='for the samples in this function, the chains of our frames that called it')
    args = p.parse_args()

    maps, samples = [], []
    for line in open(args.prof):
        if line.startswith('map '):
            f = line.split()
            if len(f) >= 7 and 'x' in f[2]:
                lo, hi = (int(v, 16) for v in f[1].split('-'))
                maps.append((lo, hi, int(f[3], 16), f[6]))
        elif line.startswith('w '):
            # the program's time since the previous sample (ns), the stack
            f = line.split()
            samples.append((int(f[1]) / 1000.0, [int(v, 16) for v in f[2:]]))
    maps.sort()
    starts = [m[0] for m in maps]
    modules = {}

    def locate(path):
        for d in args.lib:
            for root, _, files in os.walk(d):
                if os.path.basename(path) in files:
                    return os.path.join(root, os.path.basename(path))
        return path

    cache = {}

    def frame(addr):
        if addr in cache:
            return cache[addr]
        i = bisect.bisect_right(starts, addr) - 1
        if i < 0 or addr >= maps[i][1]:
            cache[addr] = ('?', '0x%x' % addr)
            return cache[addr]
        lo, hi, off, path = maps[i]
        if path not in modules:
            modules[path] = Module(locate(path))
        cache[addr] = (os.path.basename(path), modules[path].name(addr - lo + off))
        return cache[addr]

    inclusive = collections.Counter()
    leaf_module = collections.Counter()
    boundary = collections.Counter()
    chains = collections.Counter()
    leaves = collections.Counter()
    counted = 0
    for w, s in samples:
        # The handler's frames, then the signal trampoline, then the
        # interrupted instruction (exact); the rest are return addresses,
        # which point after their call: step back into it.
        skip = 0
        while skip < len(s) and frame(s[skip])[0].startswith('hostprof'):
            skip += 1
        s = s[skip + 1:]
        frames = [frame(a if k == 0 else a - 1) for k, a in enumerate(s)]
        if not frames:
            continue
        names = {f[1] for f in frames}
        if not any(r in names for r in args.root) or any(e in names for e in args.exclude):
            continue
        counted += w
        for f in set(frames):
            inclusive[f] += w
        leaf_module[frames[0][0]] += w
        if args.callers and args.callers in names:
            k = [f[1] for f in frames].index(args.callers)
            ours = [f[1] for f in frames[k + 1:] if args.ours in f[0]]
            chains[' < '.join(ours[:6])] += w
            leaves['%s [%s] < %s' % (frames[0][1], frames[0][0], frames[1][1] if len(frames) > 1 else '')] += w
        if args.ours in frames[0][0]:
            boundary['%s (our own code)' % frames[0][1]] += w
        else:
            for k in range(1, len(frames)):
                if args.ours in frames[k][0]:
                    boundary['%s -> %s [%s]' % (frames[k][1], frames[k - 1][1], frames[k - 1][0])] += w
                    break

    # every count is in µs of the program's time
    scale = 1.0 / args.calls if args.calls else 1.0
    unit = 'us/call' if args.calls else 'us'
    print('%d samples, %.0f us counted in all%s' % (
        len(samples), counted,
        ', %.1f us per call' % (counted / args.calls) if args.calls else ''))
    print('\n# inclusive (%s), our modules' % unit)
    for (mod, name), n in inclusive.most_common():
        if args.ours in mod:
            print('%9.1f  %s  [%s]' % (n * scale, name, mod))
            args.top -= 1
            if args.top <= 0:
                break
    print('\n# where the samples were (%s)' % unit)
    for mod, n in leaf_module.most_common(15):
        print('%9.1f  %s' % (n * scale, mod))
    if args.callers:
        print('\n# %s called from (%s)' % (args.callers, unit))
        for what, n in chains.most_common(30):
            print('%9.1f  %s' % (n * scale, what))
        print('\n# %s: where its samples were (%s)' % (args.callers, unit))
        for what, n in leaves.most_common(15):
            print('%9.1f  %s' % (n * scale, what))
    print('\n# our innermost frame -> what it called (%s)' % unit)
    for what, n in boundary.most_common(40):
        print('%9.1f  %s' % (n * scale, what))


if __name__ == '__main__':
    main()
