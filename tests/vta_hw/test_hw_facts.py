"""One home for every derived hardware fact: element bytes and buffer depths come from
``HwConfig``, the timing constants from ``vta_hw.timing_facts``, and nobody keeps a copy."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from vtakit.vta_hw import isa, timing_facts
from vtakit.vta_hw.config import PRESETS, preset
from vtakit.vta_hw.isa import MemType

ROOT = Path(__file__).parents[2]
PACKAGES = ("vta_hw", "vta_sim", "driver")


@pytest.mark.parametrize("name", list(PRESETS))
def test_elem_bytes_and_depth_by_memory_type(name):
    cfg = preset(name)
    lay = isa.layouts(cfg)
    # what the ISA says each memory type moves: the SRAM element (UOP: one micro-op word),
    # ACC_8BIT one int8 per accumulator lane, OUT as many elements as ACC
    want_bytes = {MemType.UOP: isa.UOP_BYTES, MemType.WGT: cfg.wgt_elem_bits // 8,
                  MemType.INP: cfg.inp_elem_bits // 8, MemType.ACC: cfg.acc_elem_bits // 8,
                  MemType.OUT: cfg.out_elem_bits // 8,
                  MemType.ACC_8BIT: cfg.acc_elem_bits // cfg.acc_width_bits}
    want_log_depth = {MemType.UOP: lay.gemm["uop_bgn"].width,
                      MemType.WGT: lay.gemm["wgt_factor_in"].width,
                      MemType.INP: lay.gemm["src_factor_in"].width,
                      MemType.ACC: lay.gemm["dst_factor_in"].width,
                      MemType.OUT: lay.gemm["dst_factor_in"].width,
                      MemType.ACC_8BIT: lay.gemm["dst_factor_in"].width}
    for mt in MemType:
        assert cfg.elem_bytes(mt) == want_bytes[mt], mt
        assert cfg.elem_bytes(int(mt)) == want_bytes[mt], mt
        assert cfg.log_depth(mt) == want_log_depth[mt], mt
        assert cfg.depth(mt) == 1 << want_log_depth[mt], mt


def test_default_elem_bytes_are_the_timing_page_table():
    # docs/timing.md, symbol E(t): UOP 4, INP 16, WGT 256, ACC 64, OUT 16, ACC_8BIT 16
    cfg = preset("default")
    assert {mt.name: cfg.elem_bytes(mt) for mt in MemType} == {
        "UOP": 4, "WGT": 256, "INP": 16, "ACC": 64, "OUT": 16, "ACC_8BIT": 16}
    assert (cfg.depth(MemType.INP), cfg.depth(MemType.WGT), cfg.depth(MemType.ACC),
            cfg.depth(MemType.UOP)) == (2048, 1024, 2048, 8192)


def test_unknown_memory_type_is_rejected():
    cfg = preset("default")
    with pytest.raises(ValueError, match=r"memory_type=6 is not a memory type \(expected an "
                                         r"isa.MemType, 0..5\)"):
        cfg.elem_bytes(6)
    with pytest.raises(ValueError, match="memory_type=-1 is not a memory type"):
        cfg.log_depth(-1)


def _sources():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            yield path, ast.parse(path.read_text(), str(path))


def _memtype_key(node: ast.AST | None) -> bool:
    """``MemType.X`` or ``isa.MemType.X``."""
    return (isinstance(node, ast.Attribute) and node.attr in MemType.__members__
            and isinstance(node.value, (ast.Name, ast.Attribute))
            and (getattr(node.value, "id", None) == "MemType"
                 or getattr(node.value, "attr", None) == "MemType"))


SIZE_WORDS = re.compile(r"elem_bytes|elem_bits|_depth|block_out|block_in|batch")


def test_no_module_keeps_its_own_elem_bytes_or_depth_table():
    """Only HwConfig maps a memory type to element bytes or a buffer depth."""
    copies = []
    for path, tree in _sources():
        rel = path.relative_to(ROOT).as_posix()
        if rel == "vta_hw/config.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict) and sum(map(_memtype_key, node.keys)) >= 2:
                values = " ".join(ast.unparse(v) for v in node.values)
                if SIZE_WORDS.search(values):
                    copies.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:80]}")
            if isinstance(node, ast.FunctionDef) and node.name in (
                    "elem_bytes", "log_depth", "depth", "_elem", "_elem_bytes_table"):
                copies.append(f"{rel}:{node.lineno}: def {node.name}")
    assert not copies, "per-memory-type size tables outside HwConfig:\n" + "\n".join(copies)


def test_timing_page_states_the_shared_constants():
    doc = (ROOT / "docs" / "timing.md").read_text()
    for name in ("GEMM_PIPELINE_CYCLES", "ALU_PIPELINE_CYCLES", "LOAD_SETUP_CYCLES",
                 "STORE_SETUP_CYCLES", "PAD_ONLY_SETUP_CYCLES"):
        assert f"`{name} = {getattr(timing_facts, name)}`" in doc, name
    assert "vta_hw/timing_facts.py" in doc
    # §2's arbitration list, highest first
    order = re.findall(r"^\d\. (\w+)", doc[doc.index("**Arbitration.**"):], flags=re.M)[:4]
    assert order == ["fetch", "compute", "load", "store"] == list(timing_facts.PORT_PRIORITY)


def test_closed_forms():
    f = timing_facts
    assert (f.gemm_cycles(64), f.alu_cycles(64, use_imm=True),
            f.alu_cycles(64, use_imm=False)) == (70, 69, 133)
    assert f.gemm_cycles(0) == f.alu_cycles(0, use_imm=False) == f.NOP_CYCLES == 1
    assert f.pad_elems(dict(y_pad_0=1, y_size=1, y_pad_1=1, x_pad_0=1, x_size=4,
                            x_pad_1=1)) == 14
    assert f.n_uops(dict(uop_bgn=2, uop_end=6, iter_out=2, iter_in=8)) == 64
    assert f.n_uops(dict(uop_bgn=6, uop_end=2, iter_out=2, iter_in=8)) == 0
    # the token table of docs/timing.md §4: every queue has one producer and one consumer
    pushed = [q for u in f.TOKEN_PUSHES.values() for _, q in u]
    popped = [q for u in f.TOKEN_POPS.values() for _, q in u]
    assert sorted(pushed) == sorted(popped) == ["g2l", "g2s", "l2g", "s2g"]
