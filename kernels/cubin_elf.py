"""The CUDA ELF images (cubins) in a file and their sections, read with
pyelftools (Debian's python3-pyelftools): for kernels/sass_reuse.py, which
the build runs, and the scripts in scripts/dev that read kernel code without
cuobjdump.

A file may be a cubin, or an object or shared library that embeds cubins
in its fatbin (uncompressed: nvcc --no-compress). Each cubin is found by its
ELF magic and its machine, EM_CUDA; its section headers end it.
"""
import collections
import io

from elftools.elf.elffile import ELFFile
from elftools.elf.structs import ELFStructs

Section = collections.namedtuple('Section', 'cubin name offset size type')
"""One section of the cubin numbered cubin (0, 1, ... in the file's order):
its bytes are data[offset:offset + size] unless type is SHT_NOBITS."""

_STRUCTS = ELFStructs(little_endian=True, elfclass=64)
_STRUCTS.create_basic_structs()
_STRUCTS.create_advanced_structs()
_HEADER = _STRUCTS.Elf_Ehdr.sizeof()


def cubins(data):
    """(offset in data, ELFFile) of each cubin in data, in order."""
    at = data.find(b'\x7fELF')
    while at >= 0 and at + _HEADER <= len(data):
        header = _STRUCTS.Elf_Ehdr.parse(bytes(data[at:at + _HEADER]))
        if header.e_machine == 'EM_CUDA' and header.e_ident.EI_CLASS == 'ELFCLASS64':
            end = at + header.e_shoff + header.e_shnum * header.e_shentsize
            yield at, ELFFile(io.BytesIO(bytes(data[at:end])))
        at = data.find(b'\x7fELF', at + 1)


def sections(data):
    """Every Section of every cubin in data (bytes or a bytearray)."""
    for n, (at, elf) in enumerate(cubins(data)):
        for section in elf.iter_sections():
            yield Section(n, section.name, at + section['sh_offset'], section['sh_size'],
                          section['sh_type'])
