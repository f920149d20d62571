"""Every DMA of a relocatable stream inside the slot it names, proven on the host before the
stream leaves it.

A :class:`~vtakit.driver.program.Program` addresses device memory only through its relocations
(slot + element offset). On the ``sim`` device a stray address is a DRAM fault; on a board
(``pynq``, ``fpga``) it reaches whatever sits at that physical address: another slot's weights,
the instruction stream, the host's own memory. So before a stream is linked, the driver proves,
for every LOAD and STORE, that it touches only bytes of the slot it names:

* a LOAD or STORE that moves bytes (``x_size > 0`` and ``y_size > 0``) has exactly one
  relocation; one that moves none has at most one (its ``dram_base`` is never used);
* a relocation sits on a LOAD or STORE (never on a GEMM, ALU or FINISH word), names a slot that
  is bound, counts elements of the instruction's memory type (``cfg.elem_bytes``), and starts at
  element ``>= 0``;
* the whole 2-d extent lies inside the slot: elements ``elem_offset + y * x_stride + x`` for
  ``y < y_size``, ``x < x_size`` (padding reads no DRAM), i.e. the last byte
  ``(elem_offset + (y_size - 1) * x_stride + x_size) * elem_bytes - 1`` is below the slot's size.
  Example: a STORE of 4 rows of 2 OUT elements of 16 B, stride 3, from element 1 ends at byte
  ``(1 + 3*3 + 2) * 16 - 1 = 191``: a slot of 192 bytes holds it, one of 176 does not;
* the program's micro-op constants are micro-ops: only LOAD UOP reads them, nothing writes them,
  and none is empty.

With the slots' roles (an artifact's section knows them, :class:`SlotAccess`): a STORE reaches
only slots the stream may write (outputs and scratch; never parameters, inputs or micro-ops), a
LOAD UOP reads only the program's constants, and no LOAD reads a slot that holds nothing yet
before a STORE of the same stream writes it. "Before" is the core's own order, not the
stream's: each unit runs its instructions in order and a pop waits for its push, so a STORE
precedes a LOAD when a chain of tokens leads from the one to the other (the simulator's rule for
FINISH, docs/timing.md §4); a LOAD that only follows the STORE in the stream races with it. A
stream that deadlocks on its tokens is refused here too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from vtakit.driver.program import Program
from vtakit.vta_hw import isa
from vtakit.vta_hw.timing_facts import LOAD_UNIT_MEMORY_TYPES, TOKEN_POPS, TOKEN_PUSHES

__all__ = ["SlotAccess", "check_confined"]

Op, T = isa.Opcode, isa.MemType
_UNITS = ("load", "compute", "store")
# plain ints: the loops below compare them per instruction (an enum member's lookup is slow)
_LOAD, _STORE, _UOP, _OUT = int(Op.LOAD), int(Op.STORE), int(T.UOP), int(T.OUT)
_MEMORY_TYPES = frozenset(int(t) for t in T)


@dataclass(frozen=True)
class SlotAccess:
    """What a stream may do with one slot.

    Parameters
    ----------
    nbytes : int
        The slot's size in device memory.
    preset : bool
        It holds its data before the stream starts (written by the host, or by an earlier
        stream); ``False``: a LOAD may read it only after a STORE of the stream writes it.
    writable : bool
        A STORE of the stream may write it.
    """

    nbytes: int
    preset: bool = True
    writable: bool = True


def check_confined(program: Program, slots: Mapping[str, SlotAccess | int], what: str,
                   *, uops_from_constants: bool = False, check_tokens: bool = False) -> None:
    """``ValueError`` (its message starting with ``what``) naming the first instruction of
    ``program`` that could touch device memory outside the slot it names (module docstring).

    ``slots`` gives every argument slot's access (an int: its size, readable and writable);
    the program's constants are slots of their own, read by LOAD UOP only. With
    ``uops_from_constants``, a LOAD UOP may read nothing else; with ``check_tokens``, a stream
    that deadlocks on its tokens is refused even when every slot is preset (the token walk is
    a Python loop over the stream: done once, when an artifact is loaded, not every run)."""
    cfg = program.cfg
    n = len(program)
    d = isa.decode_stream(program.words, cfg)
    op = d.opcode
    mem = (op == Op.LOAD) | (op == Op.STORE)
    mt = np.where(mem, d["memory_type"], -1)
    access = {s: a if isinstance(a, SlotAccess) else SlotAccess(int(a))
              for s, a in slots.items()}
    for name, words in program.constants.items():
        if np.asarray(words).size == 0:
            raise ValueError(f"{what}: micro-op constant {name!r} is empty (expected the "
                             f"micro-op words its LOAD UOP reads)")
        access[name] = SlotAccess(np.asarray(words).size * cfg.elem_bytes(T.UOP), True, False)

    reloc_of: dict[int, int] = {}
    for k, r in enumerate(program.relocs):
        at = f"{what}: relocation {k} ({r.slot!r} + {r.elem_offset})"
        if not 0 <= r.index < n:
            raise ValueError(f"{at}: instruction index {r.index} is outside the stream's "
                             f"{n} instructions")
        i = r.index
        if not mem[i]:
            raise ValueError(f"{at}: it patches instruction #{i}, a {_name(int(op[i]))}, "
                             f"which addresses no DRAM (expected a LOAD or STORE)")
        if i in reloc_of:
            raise ValueError(f"{at}: instruction #{i} {_desc(d, i)} has a second relocation "
                             f"(relocation {reloc_of[i]} already names "
                             f"{program.relocs[reloc_of[i]].slot!r}; expected exactly one)")
        reloc_of[i] = k
    size = d["x_size"] * d["y_size"]
    moving = np.flatnonzero(mem & (size > 0))
    for i in moving.tolist():  # the element size below is the memory type's
        m, store = int(mt[i]), int(op[i]) == _STORE
        if m not in _MEMORY_TYPES or (m == _OUT) != store:
            raise ValueError(f"{what}: instruction #{i} {_desc(d, i)}: expected a STORE of "
                             f"OUT or a LOAD of {', '.join(t.name for t in T if t != T.OUT)}")
    bare = [int(i) for i in moving if int(i) not in reloc_of]
    if bare:
        i = bare[0]
        raise ValueError(f"{what}: instruction #{i} {_desc(d, i)} moves "
                         f"{int(d['y_size'][i])} x {int(d['x_size'][i])} elements at absolute "
                         f"dram_base {int(d['dram_base'][i])} with no relocation (expected "
                         f"exactly one relocation naming the slot it addresses)")

    ops, mts = op.tolist(), mt.tolist()
    xs, ys, strides = d["x_size"].tolist(), d["y_size"].tolist(), d["x_stride"].tolist()
    for i, k in sorted(reloc_of.items()):
        r = program.relocs[k]
        a = access.get(r.slot)
        if a is None:
            raise ValueError(f"{what}: instruction #{i} {_desc(d, i)}: names slot {r.slot!r}, "
                             f"which is neither bound nor one of the program's constants "
                             f"(bound: {', '.join(sorted(slots)) or 'none'})"[:600])
        m, is_store = mts[i], ops[i] == _STORE
        if m not in _MEMORY_TYPES:
            raise ValueError(f"{what}: instruction #{i} {_desc(d, i)}: memory_type {m} is not "
                             f"a memory type")
        eb = cfg.elem_bytes(m)
        if r.elem_bytes != eb:
            raise ValueError(f"{what}: instruction #{i} {_desc(d, i)}: its relocation counts "
                             f"elements of {r.elem_bytes} bytes; a {T(m).name} element is "
                             f"{eb} bytes")
        if r.elem_offset < 0:
            raise ValueError(f"{what}: instruction #{i} {_desc(d, i)}: starts at element "
                             f"{r.elem_offset} of slot {r.slot!r} (expected an element offset "
                             f">= 0)")
        is_const = r.slot in program.constants
        if is_const and (is_store or m != _UOP):
            raise ValueError(f"{what}: instruction #{i} {_desc(d, i)}: addresses the "
                             f"program's micro-op constant {r.slot!r} (expected only LOAD UOP "
                             f"to read it)")
        if uops_from_constants and m == _UOP and not is_const and not is_store:
            raise ValueError(f"{what}: instruction #{i} {_desc(d, i)}: reads micro-ops from "
                             f"slot {r.slot!r} (expected one of the program's micro-op "
                             f"constants)")
        if is_store and not a.writable:
            raise ValueError(f"{what}: instruction #{i} {_desc(d, i)}: writes slot "
                             f"{r.slot!r}, which the stream may only read (expected a STORE "
                             f"to reach output and scratch slots only)")
        x, y = xs[i], ys[i]
        if x == 0 or y == 0:
            continue
        end = (r.elem_offset + (y - 1) * strides[i] + x) * eb
        if end > a.nbytes:
            raise ValueError(f"{what}: instruction #{i} {_desc(d, i)}: bytes "
                             f"{r.elem_offset * eb}..{end - 1} of slot {r.slot!r} leave its "
                             f"{a.nbytes} bytes ({y} rows of {x} elements of {eb} B, stride "
                             f"{strides[i]}, from element {r.elem_offset})")

    unset = {s for s, a in access.items() if not a.preset}
    if unset or check_tokens:
        _check_written_first(program, d, mt, reloc_of, unset, what)


def _check_written_first(program: Program, d: isa.DecodedStream, mt: np.ndarray,
                         reloc_of: Mapping[int, int], unset: set[str], what: str) -> None:
    """No LOAD of a slot in ``unset`` before a STORE of that slot happens before it."""
    clocks, position, units = _clocks(d, mt, what)
    if not unset:
        return
    store = _UNITS.index("store")
    ops = d.opcode.tolist()
    moves = (d["x_size"] * d["y_size"] > 0).tolist()
    first_store: dict[str, int] = {}
    for i, k in sorted(reloc_of.items()):
        slot = program.relocs[k].slot
        if ops[i] == _STORE and slot in unset and slot not in first_store and moves[i]:
            first_store[slot] = position[i]
    for i, k in sorted(reloc_of.items()):
        slot = program.relocs[k].slot
        if ops[i] != _LOAD or slot not in unset or not moves[i]:
            continue
        s = first_store.get(slot)
        if s is None:
            raise ValueError(f"{what}: instruction #{i} {_desc(d, i)} reads slot {slot!r}, "
                             f"which holds nothing yet and which no STORE of the stream writes "
                             f"(expected a parameter, an input, or a slot written first)")
        if clocks[i][store] <= s:
            j = _store_index(units, s)
            raise ValueError(f"{what}: instruction #{i} {_desc(d, i)} reads slot {slot!r} "
                             f"before STORE #{j} writes it: no chain of dependency tokens "
                             f"orders the STORE first (expected the reader to wait for a "
                             f"token that follows the STORE)")


def _store_index(units: list[str], pos: int) -> int:
    return [i for i, u in enumerate(units) if u == "store"][pos]


def _clocks(d: isa.DecodedStream, mt: np.ndarray, what: str
            ) -> tuple[list[tuple[int, ...]], list[int], list[str]]:
    """For each instruction, how many instructions of each unit (load, compute, store)
    complete before it starts; its position in its unit's queue; its unit. Each unit runs in
    order, a pop takes the token of the matching push (FIFO), and a token carries its pusher's
    clock, the pusher included."""
    op = d.opcode
    n = len(op)
    unit = np.full(n, _UNITS.index("compute"))
    unit[(op == _LOAD) & np.isin(mt, [int(t) for t in LOAD_UNIT_MEMORY_TYPES])] = \
        _UNITS.index("load")
    unit[op == _STORE] = _UNITS.index("store")
    units = [_UNITS[u] for u in unit.tolist()]
    flags = {f: d[f].tolist() for f in ("pop_prev", "pop_next", "push_prev", "push_next")}
    queues = {u: np.flatnonzero(unit == k).tolist() for k, u in enumerate(_UNITS)}
    position = [0] * n
    for q in queues.values():
        for p, i in enumerate(q):
            position[i] = p
    tokens: dict[str, deque[tuple[int, ...]]] = {
        t: deque() for u in _UNITS for _, t in TOKEN_POPS[u]}
    clock = {u: [0, 0, 0] for u in _UNITS}
    pos = dict.fromkeys(_UNITS, 0)
    clocks: list[tuple[int, ...]] = [()] * n
    moved = True
    while moved:
        moved = False
        for ui, u in enumerate(_UNITS):
            q = queues[u]
            while pos[u] < len(q):
                i = q[pos[u]]
                pops = [t for f, t in TOKEN_POPS[u] if flags[f][i]]
                if any(not tokens[t] for t in pops):
                    break
                c = clock[u]
                for t in pops:
                    c = [max(a, b) for a, b in zip(c, tokens[t].popleft())]
                clocks[i] = tuple(c)
                pos[u] += 1
                c[ui] = pos[u]
                clock[u] = c
                for f, t in TOKEN_PUSHES[u]:
                    if flags[f][i]:
                        tokens[t].append(tuple(c))
                moved = True
    stuck = [(u, queues[u][pos[u]]) for u in _UNITS if pos[u] < len(queues[u])]
    if stuck:
        parts = "; ".join(
            f"{u} #{i} {_desc(d, i)} waits for "
            + " and ".join(t for f, t in TOKEN_POPS[u] if flags[f][i] and not tokens[t])
            for u, i in stuck)
        raise ValueError(f"{what}: the stream deadlocks: {parts} (expected every pop to be "
                         f"matched by a push of an earlier instruction)")
    return clocks, position, units


def _name(opcode: int) -> str:
    try:
        return Op(opcode).name
    except ValueError:
        return f"opcode {opcode}"


def _desc(d: isa.DecodedStream, i: int) -> str:
    name = _name(int(d.opcode[i]))
    if int(d.opcode[i]) in (Op.LOAD, Op.STORE):
        try:
            return f"{name} {T(int(d['memory_type'][i])).name}"
        except ValueError:
            return f"{name} memory_type {int(d['memory_type'][i])}"
    return name
