"""Text form of instruction streams and micro-op arrays (``vtakit disasm``).

One line per instruction: the index, the kind (``LOAD.INP``, ``GEMM``, ``ALU.ADD`` ...), then
every field of that kind's layout as ``name=value`` in bit order, values as plain integers::

    0  LOAD.INP  opcode=0 pop_prev=0 pop_next=0 push_prev=0 push_next=1 memory_type=2 ...

so that a line can be read back field by field (:func:`parse_line`).
"""

from __future__ import annotations

import numpy as np

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig

__all__ = ["kind_name", "format_insn", "disassemble", "format_uops", "parse_line", "markdown_table"]


def kind_name(insn: isa.Insn) -> str:
    opcode = isa.Opcode(insn.opcode)
    if isinstance(insn, isa.MemInsn):
        return f"{opcode.name}.{isa.MemType(insn.memory_type).name}"
    if isinstance(insn, isa.AluInsn):
        return f"ALU.{isa.AluOp(insn.alu_opcode).name}"
    return opcode.name


def format_insn(index: int, insn: isa.Insn, cfg: HwConfig) -> str:
    lay = isa.layouts(cfg).for_opcode(insn.opcode)
    fields = " ".join(f"{f.name}={int(getattr(insn, f.name))}" for f in lay.fields)
    return f"{index:>5}  {kind_name(insn):<13} {fields}"


def disassemble(data: bytes, cfg: HwConfig) -> list[str]:
    """One line per instruction of a binary stream; ``ValueError`` names a malformed one."""
    if len(data) % isa.INSN_BYTES:
        raise ValueError(f"an instruction stream is a whole number of {isa.INSN_BYTES}-byte "
                         f"instructions, got {len(data)} bytes")
    lines = []
    for i in range(len(data) // isa.INSN_BYTES):
        word = data[i * isa.INSN_BYTES:(i + 1) * isa.INSN_BYTES]
        try:
            insn = isa.decode(word, cfg)
        except ValueError as err:
            raise ValueError(f"instruction {i} (bytes {i * isa.INSN_BYTES}.."
                             f"{(i + 1) * isa.INSN_BYTES - 1}): {err}") from None
        lines.append(format_insn(i, insn, cfg))
    return lines


def format_uops(data: bytes, cfg: HwConfig) -> list[str]:
    """One line per 32-bit micro-op: index, raw word, dst, src, wgt."""
    dst, src, wgt = isa.decode_uops(data, cfg)
    words = np.frombuffer(data, dtype="<u4")
    return [f"{i:>5}  {int(w):#010x}  dst={int(d)} src={int(s)} wgt={int(g)}"
            for i, (w, d, s, g) in enumerate(zip(words, dst, src, wgt))]


def parse_line(line: str) -> tuple[int, str, dict[str, int]]:
    """(index, kind, fields) of a line written by :func:`format_insn` or :func:`format_uops`."""
    parts = line.split()
    index, kind = int(parts[0]), parts[1]
    fields = {}
    for part in parts[2:]:
        name, _, value = part.partition("=")
        if _:
            fields[name] = int(value, 0)
    return index, kind, fields


def markdown_table(layout: isa.Layout) -> str:
    """The field table of one layout as Markdown rows (docs/isa.md embeds these verbatim)."""
    rows = ["| field | bits | width |", "|---|---|---|"]
    rows += [f"| `{f.name}` | {f.msb}:{f.lsb} | {f.width}{' signed' if f.signed else ''} |"
             for f in layout.fields]
    return "\n".join(rows)
