"""Names for addresses in kstack.sys, from its PDB: `function+0xOFFSET`.

llvm-pdbutil (Debian's `llvm`, which the build already installs) lists
every procedure symbol with its section:offset and code size; section
numbers are the image's, so the PE section table turns them into RVAs.
"""

import re
import subprocess

PROCEDURE = re.compile(r"S_[GL]PROC32 \[size = \d+\] `(?P<name>[^`]*)`")
PLACE = re.compile(r"addr = (?P<section>[0-9a-f]{4}):(?P<offset>\d+), code size = (?P<size>\d+)")
PUBLIC = re.compile(r"S_PUB32 \[size = \d+\] `(?P<name>[^`]*)`")
PUBLIC_PLACE = re.compile(r"addr = (?P<section>[0-9a-f]{4}):(?P<offset>\d+)$")


class Symbols:
    def __init__(self, pdb_path, pe):
        sections = [section.VirtualAddress for section in pe.sections]
        output = subprocess.run(
            ["llvm-pdbutil", "dump", "-symbols", pdb_path], check=True, capture_output=True, text=True
        ).stdout
        self.procedures = []
        name = None
        for line in output.splitlines():
            found = PROCEDURE.search(line)
            if found:
                name = found.group("name")
                continue
            place = PLACE.search(line)
            if place and name is not None:
                rva = sections[int(place.group("section"), 16) - 1] + int(place.group("offset"))
                self.procedures.append((rva, rva + int(place.group("size")), name))
                name = None
        self.procedures.sort()
        if not self.procedures:
            raise RuntimeError(f"{pdb_path} names no procedure")
        # Code without a procedure record (kstack's assembly thunks) is
        # named by the public symbol at or before it in its section.
        output = subprocess.run(
            ["llvm-pdbutil", "dump", "-publics", pdb_path], check=True, capture_output=True, text=True
        ).stdout
        self.publics = []
        name = None
        for line in output.splitlines():
            found = PUBLIC.search(line)
            if found:
                name = found.group("name")
                continue
            place = PUBLIC_PLACE.search(line.strip())
            if place and name is not None and int(place.group("section"), 16) == 1:
                self.publics.append((sections[0] + int(place.group("offset")), name))
            name = None
        self.publics.sort()

    def name(self, rva):
        for begin, end, name in self.procedures:
            if begin <= rva < end:
                return f"{name}+0x{rva - begin:X}"
        before = [(begin, name) for begin, name in self.publics if begin <= rva]
        if before:
            begin, name = before[-1]
            return f"{name}+0x{rva - begin:X}"
        return f"kstack.sys+0x{rva:X}"
