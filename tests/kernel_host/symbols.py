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


def listed(pdb_path, what, header, place, sections):
    """(rva, name, match of `place`) for each record `llvm-pdbutil dump
    -{what}` lists whose header line matches `header` and whose next line
    matches `place` (in the image's section `sections` gives the RVA of)."""
    output = subprocess.run(["llvm-pdbutil", "dump", f"-{what}", pdb_path], check=True, capture_output=True, text=True).stdout
    found = []
    name = None
    for line in output.splitlines():
        named = header.search(line)
        if named:
            name = named.group("name")
            continue
        placed = place.search(line.strip())
        if placed and name is not None:
            found.append((sections[int(placed.group("section"), 16) - 1] + int(placed.group("offset")), name, placed))
        name = None
    return found


class Symbols:
    image_name = "kstack.sys"

    def __init__(self, pdb_path, pe):
        sections = [section.VirtualAddress for section in pe.sections]
        self.procedures = sorted(
            (rva, rva + int(place.group("size")), name) for rva, name, place in listed(pdb_path, "symbols", PROCEDURE, PLACE, sections)
        )
        if not self.procedures:
            raise RuntimeError(f"{pdb_path} names no procedure")
        # Code without a procedure record (kstack's assembly thunks) is
        # named by the public symbol at or before it in .text (section 1).
        self.publics = sorted(
            (rva, name) for rva, name, place in listed(pdb_path, "publics", PUBLIC, PUBLIC_PLACE, sections) if place.group("section") == "0001"
        )

    def public(self, name):
        """The RVA of the public symbol `name` (kstack's assembly thunks)."""
        for rva, public in self.publics:
            if public == name:
                return rva
        raise KeyError(f"no public symbol {name}")

    def name(self, rva):
        for begin, end, name in self.procedures:
            if begin <= rva < end:
                return f"{name}+0x{rva - begin:X}"
        before = [(begin, name) for begin, name in self.publics if begin <= rva]
        if before:
            begin, name = before[-1]
            return f"{name}+0x{rva - begin:X}"
        return f"{self.image_name}+0x{rva:X}"
