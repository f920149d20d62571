"""A decoded, checked instruction stream: one field dict per instruction, routed to units."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.isa import AluOp, MemType, Opcode
from vtakit.vta_hw.timing_facts import LOAD_UNIT_MEMORY_TYPES

from .errors import SimError

__all__ = ["Program", "decode_program", "LOAD_UNIT", "COMPUTE_UNIT", "STORE_UNIT", "EXEC_UNITS",
           "kind_of"]

LOAD_UNIT, COMPUTE_UNIT, STORE_UNIT = "load", "compute", "store"
#: The units that execute instructions, in the order of a vector clock's entries.
EXEC_UNITS = (LOAD_UNIT, COMPUTE_UNIT, STORE_UNIT)


def kind_of(insn: dict[str, int]) -> str:
    """``"LOAD INP"``, ``"GEMM"``, ``"ALU ADD"``...: a short name for messages and traces."""
    op = insn["opcode"]
    try:
        name = Opcode(op).name
    except ValueError:
        return f"opcode {op}"
    if op in (Opcode.LOAD, Opcode.STORE):
        mt = insn.get("memory_type", 0)
        return f"{name} {MemType(mt).name if mt in MemType._value2member_map_ else mt}"
    if op == Opcode.ALU:
        a = insn.get("alu_opcode", 0)
        return f"ALU {AluOp(a).name if a in AluOp._value2member_map_ else a}"
    return name


@dataclass
class Program:
    """A checked stream.

    Attributes
    ----------
    insns : list[dict[str, int]]
        Decoded fields of each instruction (its own layout's fields plus ``kind``).
    unit : list[str]
        The unit each instruction is dispatched to (``"load"``, ``"compute"``, ``"store"``).
    fields : isa.DecodedStream | None
        The same fields as one int64 array per field name (0 where an instruction's kind has
        no such field), for closed forms over the whole stream; ``None`` if not kept.
    """

    insns: list[dict[str, int]]
    unit: list[str]
    fields: isa.DecodedStream | None = None


def _unit_of(op: int, mt: int) -> str:
    """The fetch unit's routing rule (docs/timing.md §3)."""
    if op == Opcode.STORE:
        return STORE_UNIT
    if op == Opcode.LOAD and mt in LOAD_UNIT_MEMORY_TYPES:
        return LOAD_UNIT
    return COMPUTE_UNIT


def decode_program(raw: np.ndarray, cfg: HwConfig) -> Program:
    """Decode and check ``raw`` (the stream's bytes); ``SimError`` for a malformed
    instruction, a memory type the unit cannot move, no FINISH, or instructions after FINISH."""
    ds = isa.decode_stream(raw, cfg)
    lay = isa.layouts(cfg)
    n = ds.count
    opcodes = ds.opcode.tolist()
    insns: list[dict[str, int]] = [{}] * n
    groups = ((lay.mem, (Opcode.LOAD, Opcode.STORE)), (lay.gemm, (Opcode.GEMM,)),
              (lay.alu, (Opcode.ALU,)), (lay.finish, (Opcode.FINISH,)))
    for layout, ops in groups:
        rows = np.flatnonzero(np.isin(ds.opcode, [int(o) for o in ops])
                              | ((ds.opcode > max(Opcode)) & (layout is lay.finish)))
        if not rows.size:
            continue
        names = layout.names
        cols = [ds[f][rows].tolist() for f in names]
        for k, vals in zip(rows.tolist(), zip(*cols)):
            insns[k] = dict(zip(names, vals))
    kinds: dict[tuple, str] = {}
    for insn in insns:
        key = (insn["opcode"], insn.get("memory_type"), insn.get("alu_opcode"))
        kind = kinds.get(key)
        if kind is None:
            kind = kinds[key] = kind_of(insn)
        insn["kind"] = kind  # type: ignore[assignment]  # a str among the ints
    bad = ds.malformed()
    if bad.size:
        k = int(bad[0])
        insn = insns[k]
        op = insn["opcode"]
        if op > max(Opcode):
            what = (f"opcode {op} is not one of "
                    f"{', '.join(f'{o.name}={o.value}' for o in Opcode)}")
        elif op == Opcode.ALU:
            what = (f"alu_opcode {insn['alu_opcode']} is not one of "
                    f"{', '.join(f'{o.name}={o.value}' for o in AluOp)}")
        else:
            what = (f"memory_type {insn['memory_type']} is not one of "
                    f"{', '.join(f'{o.name}={o.value}' for o in MemType)}")
        raise SimError(f"malformed instruction: {what}", k, insn)
    unit = []
    for k, insn in enumerate(insns):
        op = insn["opcode"]
        mt = insn.get("memory_type", -1)
        if op == Opcode.STORE and mt != MemType.OUT:
            raise SimError(f"STORE of memory_type {MemType(mt).name} is not supported "
                           f"(expected OUT)", k, insn)
        if op == Opcode.LOAD and mt == MemType.OUT:
            raise SimError("LOAD of memory_type OUT is not supported (expected UOP, WGT, "
                           "INP, ACC or ACC_8BIT)", k, insn)
        unit.append(_unit_of(op, mt))
    finishes = [k for k, op in enumerate(opcodes) if op == Opcode.FINISH]
    if not finishes:
        last = insns[-1] if insns else None
        raise SimError(f"no FINISH within insn_count={n} instructions (expected the stream "
                       f"to end with FINISH)", n - 1 if n else None, last)
    if finishes[0] != n - 1:
        k = finishes[0] + 1
        raise SimError(f"instruction after FINISH (FINISH is #{finishes[0]}; expected FINISH "
                       f"to be the last of the {n} instructions)", k, insns[k])
    return Program(insns, unit, ds)
