"""What the CPU runner checks in an artifact's section before it loads any code.

An object file is native code for one machine: loaded on another, or with calls that do not
match its functions, it crashes the process instead of raising. So before anything is loaded:

- every object file's ELF header must say what its section metadata says (the triple's
  machine, word size and byte order; `check_object`), and the one chosen to run here must be for
  this host's machine;
- every call of the plan must name a function that ``module.ll`` defines, with one signature
  letter per parameter of the right type (`ir_signatures`, `check_calls`).

The object code itself cannot be checked beyond its header: the artifact's checksums guard it.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from ..plan import PlanError, Step

# The machines objects are built for: triple architecture -> (ELF e_machine, word size in bits,
# little-endian).
ELF_MACHINES: dict[str, tuple[int, int, bool]] = {
    "x86_64": (62, 64, True), "aarch64": (183, 64, True), "arm64": (183, 64, True),
    "riscv64": (243, 64, True), "powerpc64le": (21, 64, True), "powerpc64": (21, 64, False),
    "s390x": (22, 64, False), "i386": (3, 32, True), "i686": (3, 32, True),
}
_ET_REL = 1  # a relocatable object (what `llvm.emit_object` writes)
_DEFINE = re.compile(r"^define\b[^@\n]*@([-\w$.]+|\"[^\"\n]*\")\(", re.M)
_LETTER = {"ptr": "p", "i64": "l", "float": "f"}


class ElfHeader(NamedTuple):
    machine: int
    bits: int
    little_endian: bool
    type: int


def elf_header(data: bytes) -> ElfHeader:
    """The fields of an ELF header that say which machine the file is for (`ValueError` if
    `data` does not start with one)."""
    if len(data) < 52 or data[:4] != b"\x7fELF":
        raise ValueError(f"not an ELF object file (starts with {data[:4]!r}, expected "
                         f"b'\\x7fELF')")
    cls, order = data[4], data[5]
    if cls not in (1, 2) or order not in (1, 2):
        raise ValueError(f"ELF class {cls} / data encoding {order}, expected 1 or 2 each")
    fmt = "<HH" if order == 1 else ">HH"
    etype, machine = struct.unpack_from(fmt, data, 16)
    return ElfHeader(machine, 32 * cls, order == 1, etype)


def _describe(h: ElfHeader) -> str:
    names = sorted(a for a, (m, bits, le) in ELF_MACHINES.items()
                   if (m, bits, le) == (h.machine, h.bits, h.little_endian))
    name = names[0] if names else "unknown"
    return (f"ELF machine {h.machine} ({name}), {h.bits}-bit, "
            f"{'little' if h.little_endian else 'big'}-endian")


def _expected(arch: str) -> str:
    m, bits, le = ELF_MACHINES[arch]
    return f"ELF machine {m} ({arch}), {bits}-bit, {'little' if le else 'big'}-endian"


def check_object(member: str, data: bytes, triple: str) -> None:
    """`ValueError` unless `data` is a relocatable ELF object for `triple`'s machine (a triple
    of a machine not in `ELF_MACHINES` is not checked beyond the header)."""
    try:
        h = elf_header(data)
    except ValueError as e:
        raise ValueError(f"cpu/{member}: {e}") from None
    if h.type != _ET_REL:
        raise ValueError(f"cpu/{member}: ELF type {h.type}, expected {_ET_REL} (a relocatable "
                         f"object)")
    arch = triple.split("-")[0]
    if arch in ELF_MACHINES and (h.machine, h.bits, h.little_endian) != ELF_MACHINES[arch]:
        raise ValueError(f"cpu/{member}: the object is for {_describe(h)}; its metadata says "
                         f"triple {triple!r}, expected {_expected(arch)}")


def check_host_object(member: str, data: bytes, host_triple: str) -> bool:
    """Whether object `member` can be loaded on this host (triple `host_triple`): `PlanError`
    if it is for another machine (loading it would crash the process); False where this host's
    machine is not in `ELF_MACHINES` (the caller compiles the IR instead)."""
    arch = host_triple.split("-")[0]
    if arch not in ELF_MACHINES:
        return False
    try:
        h = elf_header(data)
    except ValueError as e:
        raise PlanError(f"cpu/{member}: {e}") from None
    if (h.machine, h.bits, h.little_endian) != ELF_MACHINES[arch]:
        raise PlanError(f"cpu/{member}: its metadata says it is for this host ({host_triple}), "
                        f"but the object is for {_describe(h)}, expected {_expected(arch)}: "
                        f"refusing to load native code for another machine")
    return True


def _split_params(text: str) -> list[str]:
    """Split a parameter list at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:])
    return [p.strip() for p in parts]


def ir_signatures(ir_text: str) -> dict[str, str]:
    """Every function ``ir_text`` defines, with its parameters as signature letters (p ptr,
    l i64, f float; ``?`` any other type)."""
    sigs: dict[str, str] = {}
    for m in _DEFINE.finditer(ir_text):
        depth, i = 1, m.end()
        while i < len(ir_text) and depth and ir_text[i] != "\n":
            depth += {"(": 1, ")": -1}.get(ir_text[i], 0)
            i += 1
        if depth:
            continue  # not a definition this reader understands; no call can match it
        letters = []
        for p in _split_params(ir_text[m.end():i - 1]):
            ty = p.split()[0] if p.split() else ""
            letters.append(_LETTER.get(ty, "p" if ty.endswith("*") else "?"))
        sigs[m.group(1).strip('"')] = "".join(letters)
    return sigs


def check_calls(steps: Sequence[Step], kernels: int, sigs: Mapping[str, str]) -> None:
    """`PlanError` unless every call of `steps` names a kernel < `kernels` and a function of
    `sigs` (`ir_signatures`) with the call's signature."""
    from .llvm import symbol

    for s in steps:
        for j, c in enumerate(s.calls):
            where = f"step {s.name!r} call {j} ({c.fname})"
            if c.kernel >= kernels:
                raise PlanError(f"{where} kernel: expected an index < {kernels} (the cpu "
                                f"section's kernels), got {c.kernel}")
            name = symbol(c.kernel, c.fname)
            have = sigs.get(name)
            if have is None:
                raise PlanError(f"{where}: cpu/module.ll defines no function {name!r}")
            if have != c.sig:
                raise PlanError(f"{where} sig: cpu/module.ll defines {name} with parameters "
                                f"{have!r}, the plan calls it with {c.sig!r}")
