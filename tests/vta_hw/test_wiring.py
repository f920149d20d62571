# amaranth: UnusedElaboratable=no
"""The units talk through typed ``wiring`` signatures (vta_hw/interfaces.py), joined in top.py
with ``wiring.connect``; nothing is wired by building attribute names from strings."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from amaranth.hdl import Fragment, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw.compute import Compute
from vtakit.vta_hw.config import preset
from vtakit.vta_hw.fetch import Fetch
from vtakit.vta_hw.interfaces import (
    CommandSignature,
    CommandWriteSignature,
    MemBusSignature,
    MemClientSignature,
    TokenPopSignature,
    TokenPushSignature,
)
from vtakit.vta_hw.isa import INSN_WIDTH_BITS
from vtakit.vta_hw.load import Load
from vtakit.vta_hw.mem_port import MemPort
from vtakit.vta_hw.queues import CmdQueue, TokenCounter
from vtakit.vta_hw.store import Store
from vtakit.vta_hw.top import Core

HW = Path(__file__).parents[2] / "vta_hw"


def _members(component) -> dict:
    return dict(component.signature.members.items())


@pytest.mark.parametrize("name", ["default", "ice40"])
def test_units_declare_typed_interfaces(name):
    cfg = preset(name)
    snoop = cfg.cmd_queue_depth == 1
    read, write = MemClientSignature(cfg), MemClientSignature(cfg, write=True)
    cmd = In(CommandSignature(INSN_WIDTH_BITS, snoop=snoop))
    pop, push = Out(TokenPopSignature()), Out(TokenPushSignature())
    fetch = _members(Fetch(cfg))
    assert fetch["mem"] == Out(read)
    for q in ("load_cmd", "compute_cmd", "store_cmd"):
        assert fetch[q] == Out(CommandWriteSignature(INSN_WIDTH_BITS))
    load, compute, store = _members(Load(cfg)), _members(Compute(cfg)), _members(Store(cfg))
    assert load["mem"] == compute["mem"] == Out(read) and store["mem"] == Out(write)
    assert load["cmd"] == compute["cmd"] == store["cmd"] == cmd
    assert load["g2l"] == compute["l2g"] == compute["s2g"] == store["g2s"] == pop
    assert load["l2g"] == compute["g2l"] == compute["g2s"] == store["s2g"] == push
    port = _members(MemPort(cfg))
    assert port["fetch"] == port["compute"] == port["load"] == In(read)
    assert port["store"] == In(write) and port["bus"] == Out(MemBusSignature(cfg))
    queue = _members(CmdQueue(cfg.cmd_queue_depth))
    assert queue["w"] == In(CommandWriteSignature(INSN_WIDTH_BITS)) and queue["r"] == Out(
        CommandSignature(INSN_WIDTH_BITS, snoop=snoop))
    tokens = _members(TokenCounter(cfg.dep_queue_depth))
    assert tokens["producer"] == In(TokenPushSignature())
    assert tokens["consumer"] == In(TokenPopSignature())


def test_connect_checks_the_signatures():
    cfg = preset("ice40")
    fetch, port = Fetch(cfg), MemPort(cfg)
    with pytest.raises(wiring.ConnectionError):  # a reader cannot be the port's write client
        wiring.connect(Module(), fetch.mem, port.store)


@pytest.mark.parametrize("name", ["default", "ice40"])
def test_core_elaborates_with_its_flat_memory_ports(name):
    core = Core(preset(name))
    Fragment.get(core, None)  # runs every connect()
    assert [n for n in core.signature.members if n.startswith("mem_")] == [
        "mem_rd_valid", "mem_rd_addr", "mem_rd_beats", "mem_rd_data_valid", "mem_rd_data",
        "mem_wr_valid", "mem_wr_addr", "mem_wr_beats", "mem_wr_data_valid", "mem_wr_data",
        "mem_wr_strb"]
    assert list(MemBusSignature(preset(name)).members) == [
        n.removeprefix("mem_") for n in core.signature.members if n.startswith("mem_")]


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and ast.unparse(n.func).split(".")[-1] == name]


def test_top_wires_units_with_connect():
    tree = ast.parse((HW / "top.py").read_text())
    # 4 memory clients, 3 queue writers, 3 queue readers, 4 token queues x 2 sides
    assert len(_calls(tree, "connect")) == 4 + 3 + 3 + 8
    assert not _calls(tree, "getattr") and not _calls(tree, "setattr")


def test_no_attribute_names_built_from_strings():
    bad = []
    for path in sorted(HW.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for call in _calls(tree, "getattr") + _calls(tree, "setattr"):
            if len(call.args) > 1 and isinstance(call.args[1], (ast.JoinedStr, ast.BinOp)):
                bad.append(f"{path.name}:{call.lineno}: {ast.unparse(call)}")
    assert not bad, "\n".join(bad)
