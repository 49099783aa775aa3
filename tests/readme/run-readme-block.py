#!/usr/bin/python3
"""Runs one fenced code block of README.md, as a reader would paste it.

    run-readme-block.py README.md --list
    run-readme-block.py README.md N SOURCE-ROOT BUILD-ROOT [--have-cuda]

The info string names the language (c, python, js, vala) and may add
`gpu`: such a block is compiled (C, Vala) but run only where a CUDA device
is usable, else the test is skipped (exit 77). `sh setup` blocks are the
set-up commands that build and run these tests (they would recurse), and
`text` blocks are not programs: neither is run. --list prints `N LANGUAGE`
for each block that runs; any other info string is an error, so that no
block goes untested.

Against the uninstalled build: pkg-config's gmlp-1.0-uninstalled.pc, the
build's typelib, vapi and library, and the source tree's overrides.
"""
import os
import shutil
import subprocess
import sys
import tempfile

RUN = ('c', 'python', 'js', 'vala')
NOT_RUN = ('text', 'sh setup')


def blocks(path):
    """(info string, code) of each fenced block, in order."""
    found, info, code = [], None, []
    for line in open(path, encoding='utf-8'):
        if info is None:
            if line.startswith('```'):
                info, code = line[3:].strip(), []
        elif line.startswith('```'):
            found.append((info, ''.join(code)))
            info = None
        else:
            code.append(line)
    if info is not None:
        sys.exit('%s: a block is not closed' % path)
    return found


def runnable(path):
    for n, (info, _) in enumerate(blocks(path)):
        words = info.split()
        if info in NOT_RUN:
            continue
        if not words or words[0] not in RUN or any(w != 'gpu' for w in words[1:]):
            sys.exit('%s: block %d has the info string %r: say one of %s, or %s' %
                     (path, n, info, ', '.join(RUN), ' or '.join(NOT_RUN)))
        yield n, words[0], 'gpu' in words[1:]


def cuda_usable(env):
    probe = ("import gi; gi.require_version('Gmlp', '1.0'); from gi.repository import Gmlp; "
             "Gmlp.Device.new(Gmlp.DeviceKind.CUDA, 0)")
    return subprocess.run(['/usr/bin/python3', '-c', probe], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def main():
    readme = sys.argv[1]
    if sys.argv[2:] == ['--list']:
        for n, language, gpu in runnable(readme):
            print(n, language + ('-gpu' if gpu else ''))
        return 0
    n, source, build = int(sys.argv[2]), sys.argv[3], sys.argv[4]
    have_cuda = '--have-cuda' in sys.argv
    language, gpu = next((lang, gpu) for i, lang, gpu in runnable(readme) if i == n)
    code = blocks(readme)[n][1]
    print('README.md block %d (%s%s):\n%s' % (n, language, ', gpu' if gpu else '', code), flush=True)

    work = tempfile.mkdtemp(prefix='gmlp-readme-')
    try:
        return run(language, gpu, code, work, source, build, have_cuda)
    finally:
        shutil.rmtree(work)


def run(language, gpu, code, work, source, build, have_cuda):
    lib = os.path.join(build, 'libgmlp')
    overrides = os.path.join(work, 'site', 'gi', 'overrides')
    os.makedirs(overrides)
    os.symlink(os.path.join(source, 'gir', 'Gmlp.py'), os.path.join(overrides, 'Gmlp.py'))
    env = dict(os.environ,
               PKG_CONFIG_PATH=os.path.join(build, 'meson-uninstalled'),
               LD_LIBRARY_PATH=lib, GI_TYPELIB_PATH=lib,
               PYTHONPATH=os.path.join(work, 'site'),
               GMLP_BACKEND_DIR=os.path.join(lib, 'backend', 'cuda'),
               G_DEBUG='fatal-warnings')
    run_it = not gpu or (have_cuda and cuda_usable(env))
    if not run_it:
        env['GMLP_DEVICE'] = 'cpu'

    def check(command):
        print('$', ' '.join(command), flush=True)
        subprocess.run(command, cwd=work, env=env, check=True)

    name = os.path.join(work, 'block')
    pkg = subprocess.run(['pkg-config', '--cflags', '--libs', 'gmlp-1.0'], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    if language == 'c':
        open(name + '.c', 'w').write(code)
        check(['cc', '-o', name, name + '.c', '-Werror=implicit-function-declaration',
               '-Werror=incompatible-pointer-types', '-Werror=int-conversion'] + pkg)
        command = [name]
    elif language == 'vala':
        open(name + '.vala', 'w').write(code)
        check(['valac', '--vapidir', lib, '--pkg', 'gmlp-1.0', '--pkg', 'gio-2.0', '-X', '-w',
               '-o', name, name + '.vala'])
        command = [name]
    elif language == 'python':
        open(name + '.py', 'w').write(code)
        command = ['/usr/bin/python3', name + '.py']
    else:
        open(name + '.js', 'w').write(code)
        command = ['gjs', '-m', name + '.js']
    if not run_it:
        print('needs a CUDA device: skipped')
        return 77
    check(command)
    return 0


if __name__ == '__main__':
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as e:
        sys.exit('failed: %s' % e)
