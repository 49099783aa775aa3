"""The sections of an ELF image (a cubin, or one embedded in a backend),
for the scripts here that read kernel code without cuobjdump."""
import struct


def sections(elf):
    """(name, offset, size) of each section of the 64-bit ELF image elf."""
    shoff, = struct.unpack_from('<Q', elf, 0x28)
    entsize, count, names = struct.unpack_from('<HHH', elf, 0x3a)
    headers = [struct.unpack_from('<IIQQQQ', elf, shoff + i * entsize) for i in range(count)]
    strings = headers[names][4]
    for name, _, _, _, offset, size in headers:
        end = elf.index(b'\0', strings + name)
        yield elf[strings + name:end].decode(), offset, size
