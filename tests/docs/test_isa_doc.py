"""docs/isa.md is checked against isa.py so that it cannot drift."""

import re
from pathlib import Path

import pytest

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset
from vtakit.vta_hw.disasm import markdown_table

DOC = (Path(__file__).parents[2] / "docs" / "isa.md").read_text()
CFG = preset("default")
ENUMS = {"memory_type": isa.MemType, "alu_opcode": isa.AluOp}
CLASSES = {"LOAD": isa.MemInsn, "STORE": isa.MemInsn, "GEMM": isa.GemmInsn,
           "ALU": isa.AluInsn, "FINISH": isa.FinishInsn}


def _blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", DOC, flags=re.S)


def _examples(lang):
    """(fields line, expected word) pairs: a line of fields, then '    = 0x...'."""
    pairs = []
    for block in _blocks(lang):
        lines = block.strip().splitlines()
        assert len(lines) % 2 == 0, block
        for text, word in zip(lines[::2], lines[1::2]):
            assert word.strip().startswith("= 0x"), word
            pairs.append((text, int(word.strip()[2:], 16)))
    return pairs


@pytest.mark.parametrize("kind", ["mem", "gemm", "alu", "finish", "uop"])
def test_field_tables_match_isa(kind):
    assert markdown_table(getattr(isa.layouts(CFG), kind)) in DOC


def test_instruction_examples_encode_as_written():
    examples = _examples("insn")
    assert len(examples) >= 10
    for text, word in examples:
        kind, *fields = text.split()
        values = {}
        for item in fields:
            name, value = item.split("=")
            values[name] = ENUMS[name][value] if name in ENUMS else int(value)
        if kind in ("LOAD", "STORE"):
            values["opcode"] = isa.Opcode[kind]
        if kind in ("GEMM", "ALU"):  # zero fields are left out of the page
            values.setdefault("iter_out", 0)
            values.setdefault("iter_in", 0)
        insn = CLASSES[kind](**values)
        assert isa.encode(insn, CFG) == word, text
        assert isa.decode(word, CFG) == insn


def test_uop_examples_encode_as_written():
    examples = _examples("uops")
    assert len(examples) == 10
    for text, word in examples:
        values = dict(item.split("=") for item in text.split())
        uop = isa.Uop(**{k: int(v) for k, v in values.items()})
        assert int(isa.encode_uops([uop], CFG)[0]) == word, text


def test_conv_window_example_is_the_3x3_convolution():
    # The micro-ops of the worked GEMM example walk a 3x3 window of a 6-wide padded tile.
    uops = [dict(item.split("=") for item in text.split()) for text, _ in _examples("uops")]
    taps = [(int(u["src"]), int(u["wgt"])) for u in uops[:9]]
    assert taps == [(ky * 6 + kx, ky * 3 + kx) for ky in range(3) for kx in range(3)]
