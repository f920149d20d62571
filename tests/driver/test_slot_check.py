"""`driver.slot_check`: every LOAD and STORE of a relocatable stream inside the slot it names,
each class of escape refused with its message, and a fuzz of relocations whose every accepted
case stays inside its slots when it runs."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from watched_sim import WatchedSim

from vtakit.driver import Session, SimDevice, Stage
from vtakit.driver.program import Program, Reloc
from vtakit.driver.slot_check import SlotAccess, check_confined
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset
from vtakit.vta_hw.isa import AluOp, MemType

CFG = preset("default")
OUT_B, ACC_B = CFG.elem_bytes(MemType.OUT), CFG.elem_bytes(MemType.ACC)


def _relu_program() -> tuple[Program, dict[str, int]]:
    """x (4 ACC elements) -> ReLU -> y (4 OUT elements), recorded: LOAD UOP, LOAD ACC, ALU,
    STORE, FINISH."""
    s = Session(SimDevice(CFG))
    x = s.alloc((4, 16), np.int32, name="x")
    y = s.alloc((4, 16), np.int8, name="y")
    with s.record() as out:
        s.load_2d(x, 0, x_size=4, y_size=1, x_stride=4, sram_base=0, memory_type=MemType.ACC)
        relu = s.uop_kernel("relu", lambda k: k.loop(4, dst=1).push(0), mode="alu",
                            alu_opcode=AluOp.MAX, use_imm=True, imm=0)
        s.alu(relu)
        s.dep_push(Stage.COMPUTE, Stage.STORE)
        s.dep_pop(Stage.COMPUTE, Stage.STORE)
        s.store_2d(y, 0, x_size=4, y_size=1, x_stride=4, sram_base=0)
    return out[0], {"x": x.nbytes, "y": y.nbytes}


def _index(prog: Program, opcode: isa.Opcode, mt: MemType | None = None) -> int:
    for i, insn in enumerate(prog.insns()):
        if insn.opcode == opcode and (mt is None or insn.memory_type == mt):
            return i
    raise AssertionError(f"no {opcode.name}")


def _with(prog: Program, relocs=None, constants=None, insns=None) -> Program:
    words = prog.words if insns is None else Program.from_insns(prog.cfg, insns).words
    return Program(prog.cfg, words, list(prog.relocs if relocs is None else relocs),
                   dict(prog.constants if constants is None else constants))


def test_a_recorded_stream_is_confined():
    prog, sizes = _relu_program()
    check_confined(prog, sizes, "p")
    check_confined(prog, {"x": SlotAccess(sizes["x"], True, False),
                          "y": SlotAccess(sizes["y"], False, True)}, "p",
                   uops_from_constants=True)


def _reloc_at(prog: Program, i: int) -> tuple[int, Reloc]:
    return next((k, r) for k, r in enumerate(prog.relocs) if r.index == i)


def _case(name: str) -> tuple[Program, dict, str]:
    """One escape of each class, its program, its slots and the message that refuses it."""
    prog, sizes = _relu_program()
    st = _index(prog, isa.Opcode.STORE)
    ld = _index(prog, isa.Opcode.LOAD, MemType.ACC)
    alu = _index(prog, isa.Opcode.ALU)
    k, r = _reloc_at(prog, st)
    relocs = list(prog.relocs)
    roles = {"x": SlotAccess(sizes["x"], True, False), "y": SlotAccess(sizes["y"], False, True)}
    if name == "store onto a read-only slot":
        relocs[k] = dataclasses.replace(r, slot="x", elem_bytes=OUT_B)
        return _with(prog, relocs), roles, r"writes slot 'x', which the stream may only read"
    if name == "store past its slot":
        relocs[k] = dataclasses.replace(r, elem_offset=1)
        return _with(prog, relocs), sizes, r"bytes 16\.\.79 of slot 'y' leave its 64 bytes"
    if name == "negative offset":
        relocs[k] = dataclasses.replace(r, elem_offset=-1)
        return _with(prog, relocs), sizes, r"starts at element -1 of slot 'y'"
    if name == "offset past every slot":
        relocs[k] = dataclasses.replace(r, elem_offset=1 << 20)
        return _with(prog, relocs), sizes, r"leave its 64 bytes"
    if name == "wrong element size":
        relocs[k] = dataclasses.replace(r, elem_bytes=ACC_B)
        return _with(prog, relocs), sizes, (r"counts elements of 64 bytes; a OUT element is 16 "
                                            r"bytes")
    if name == "no relocation":
        del relocs[k]
        return _with(prog, relocs), sizes, (r"instruction #\d+ STORE OUT moves 1 x 4 elements "
                                            r"at absolute dram_base 0 with no relocation")
    if name == "relocation onto a GEMM word":
        relocs.append(Reloc(alu, "y", 0, OUT_B))
        return _with(prog, relocs), sizes, (r"patches instruction #\d+, a ALU, which addresses "
                                            r"no DRAM")
    if name == "two relocations":
        relocs.append(dataclasses.replace(r))
        return _with(prog, relocs), sizes, r"has a second relocation"
    if name == "an emptied micro-op constant":
        consts = {n: w[:0] for n, w in prog.constants.items()}
        return _with(prog, constants=consts), sizes, r"micro-op constant 'uop:\w+' is empty"
    if name == "an unbound slot":
        return prog, {"x": sizes["x"]}, r"names slot 'y', which is neither bound"
    if name == "a load of a micro-op constant as ACC":
        kk, rr = _reloc_at(prog, ld)
        const = next(iter(prog.constants))
        relocs[kk] = dataclasses.replace(rr, slot=const)
        return _with(prog, relocs), sizes, (r"addresses the program's micro-op constant "
                                            r"'uop:\w+' \(expected only LOAD UOP to read it\)")
    if name == "micro-ops from an argument":
        ku = _index(prog, isa.Opcode.LOAD, MemType.UOP)
        kk, rr = _reloc_at(prog, ku)
        relocs[kk] = dataclasses.replace(rr, slot="x")
        return _with(prog, relocs), roles, r"reads micro-ops from slot 'x'"
    if name == "a load before anything is written":
        roles["x"] = SlotAccess(sizes["x"], False, True)
        return prog, roles, r"reads slot 'x', which holds nothing yet"
    raise AssertionError(name)


CASES = ["store onto a read-only slot", "store past its slot", "negative offset",
         "offset past every slot", "wrong element size", "no relocation",
         "relocation onto a GEMM word", "two relocations", "an emptied micro-op constant",
         "an unbound slot", "a load of a micro-op constant as ACC",
         "micro-ops from an argument", "a load before anything is written"]


@pytest.mark.parametrize("name", CASES)
def test_each_escape_is_refused_naming_it(name):
    prog, slots, message = _case(name)
    with pytest.raises(ValueError, match=r"^p: .*" + message):
        check_confined(prog, slots, "p", uops_from_constants=True)


@pytest.mark.parametrize("name", ["store past its slot", "no relocation", "negative offset",
                                  "relocation onto a GEMM word", "an emptied micro-op constant"])
def test_run_program_refuses_them_before_the_device_sees_them(name):
    prog, _, message = _case(name)
    dev = SimDevice(CFG)
    s = Session(dev)
    x, y = s.alloc((4, 16), np.int32, name="x"), s.alloc((4, 16), np.int8, name="y")
    ran = []
    dev.run = lambda *a: ran.append(a)  # type: ignore[method-assign]
    with pytest.raises(ValueError, match=message):
        s.run_program(prog, {"x": x, "y": y})
    assert not ran


def test_a_slot_bound_by_an_address_must_be_an_array_of_the_session():
    prog, _ = _relu_program()
    s = Session(SimDevice(CFG))
    x, y = s.alloc((4, 16), np.int32, name="x"), s.alloc((4, 16), np.int8, name="y")
    s.run_program(prog, {"x": x.addr, "y": y.addr})
    with pytest.raises(ValueError, match=r"slot 'y' is bound to address 0x[0-9a-f]+, where no "
                                         r"array of this session starts"):
        s.run_program(prog, {"x": x, "y": y.addr + 16})


def test_a_load_that_races_its_store_is_refused():
    """The STORE precedes the LOAD in the stream, but no token orders them: the load unit may
    read the slot before the store unit writes it."""
    s = Session(SimDevice(CFG))
    a = s.alloc((1, 16), np.int8, name="a")
    with s.record() as out:
        s.store_2d(a, 0, x_size=1, y_size=1, x_stride=1, sram_base=0)
        s.load_2d(a, 0, x_size=1, y_size=1, x_stride=1, sram_base=0,
                  memory_type=MemType.INP)
    prog = out[0]
    roles = {"a": SlotAccess(a.nbytes, preset=False, writable=True)}
    with pytest.raises(ValueError, match=r"reads slot 'a' before STORE #\d+ writes it: no "
                                         r"chain of dependency tokens"):
        check_confined(prog, roles, "p")
    with s.record() as out:
        s.store_2d(a, 0, x_size=1, y_size=1, x_stride=1, sram_base=0)
        s.dep_push(Stage.STORE, Stage.COMPUTE)
        s.dep_pop(Stage.STORE, Stage.COMPUTE)
        s.dep_push(Stage.COMPUTE, Stage.LOAD)
        s.dep_pop(Stage.COMPUTE, Stage.LOAD)
        s.load_2d(a, 0, x_size=1, y_size=1, x_stride=1, sram_base=0,
                  memory_type=MemType.INP)
    check_confined(out[0], roles, "p")  # store -> compute -> load: ordered


def test_a_stream_that_deadlocks_is_refused():
    prog, sizes = _relu_program()
    insns = prog.insns()
    i = _index(prog, isa.Opcode.STORE)
    insns[i] = dataclasses.replace(insns[i], pop_prev=1, push_prev=0)
    insns[_index(prog, isa.Opcode.ALU)] = dataclasses.replace(
        insns[_index(prog, isa.Opcode.ALU)], push_next=0)
    roles = {"x": SlotAccess(sizes["x"], True, False), "y": SlotAccess(sizes["y"], True, True)}
    with pytest.raises(ValueError, match=r"the stream deadlocks: .*store #\d+ STORE OUT waits "
                                         r"for g2s"):
        check_confined(_with(prog, insns=insns), roles, "p", check_tokens=True)


# ---- the class: random relocations and sizes, run on a watched device ---------------------

def _mutate(rng: random.Random, prog: Program) -> Program:
    insns = prog.insns()
    relocs = list(prog.relocs)
    for _ in range(rng.randint(1, 3)):
        what = rng.choice(["offset", "slot", "bytes", "index", "drop", "dup", "x_size",
                           "y_size", "x_stride"])
        k = rng.randrange(len(relocs)) if relocs else None
        if k is None:
            break
        r = relocs[k]
        if what == "offset":
            relocs[k] = dataclasses.replace(r, elem_offset=rng.choice([-1, 1, 2, 3, 64, 1 << 16]))
        elif what == "slot":
            relocs[k] = dataclasses.replace(r, slot=rng.choice(["x", "y"]))
        elif what == "bytes":
            relocs[k] = dataclasses.replace(r, elem_bytes=rng.choice([1, 4, 16, 64, 256]))
        elif what == "index":
            relocs[k] = dataclasses.replace(r, index=rng.randrange(len(insns)))
        elif what == "drop":
            del relocs[k]
        elif what == "dup":
            relocs.append(r)
        else:
            i = r.index
            if isinstance(insns[i], isa.MemInsn):
                insns[i] = dataclasses.replace(insns[i], **{what: rng.choice([0, 1, 2, 4, 5, 8])})
    return Program.from_insns(prog.cfg, insns, relocs, prog.constants)


def test_every_accepted_mutation_writes_only_its_slots():
    """200 seeded mutations of a stream's relocations and transfer sizes: each is refused by
    `run_program` with a ValueError, or runs (possibly into a simulator error) changing no
    byte of device memory outside the slots it is bound to (not its micro-ops, not its
    instructions, not free memory)."""
    base, _ = _relu_program()
    rng = random.Random(40)
    refused = ran = 0
    for _ in range(200):
        prog = _mutate(rng, base)
        dev = WatchedSim(CFG, dram_bytes=1 << 20)
        s = Session(dev)
        x = s.array(np.arange(64, dtype=np.int32).reshape(4, 16), name="x")
        y = s.alloc((4, 16), np.int8, name="y")
        try:
            s.run_program(prog, {"x": x, "y": y})
        except Exception:  # noqa: BLE001 - a refusal, or a device error once it ran
            pass
        if not hasattr(dev, "changed"):  # refused before the device saw it
            refused += 1
            continue
        ran += 1
        outside = [int(a) for a in dev.changed if not any(
            b.addr <= a < b.addr + b.nbytes for b in (x, y))]
        assert not outside, f"the stream wrote bytes {outside[:4]} outside slots x and y"
    assert refused > 100 and ran > 10
