import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import PRESETS, preset

DEFAULT = preset("default")

# Bit positions of VTA hw_spec.h 0.0.2 for the default configuration, (msb, lsb).
PINNED = {
    "mem": {"opcode": (2, 0), "pop_prev": (3, 3), "pop_next": (4, 4), "push_prev": (5, 5),
            "push_next": (6, 6), "memory_type": (9, 7), "sram_base": (25, 10),
            "dram_base": (57, 26), "y_size": (79, 64), "x_size": (95, 80),
            "x_stride": (111, 96), "y_pad_0": (115, 112), "y_pad_1": (119, 116),
            "x_pad_0": (123, 120), "x_pad_1": (127, 124)},
    "gemm": {"opcode": (2, 0), "pop_prev": (3, 3), "pop_next": (4, 4), "push_prev": (5, 5),
             "push_next": (6, 6), "reset": (7, 7), "uop_bgn": (20, 8), "uop_end": (34, 21),
             "iter_out": (48, 35), "iter_in": (62, 49), "dst_factor_out": (74, 64),
             "dst_factor_in": (85, 75), "src_factor_out": (96, 86),
             "src_factor_in": (107, 97), "wgt_factor_out": (117, 108),
             "wgt_factor_in": (127, 118)},
    "alu": {"opcode": (2, 0), "pop_prev": (3, 3), "pop_next": (4, 4), "push_prev": (5, 5),
            "push_next": (6, 6), "reset": (7, 7), "uop_bgn": (20, 8), "uop_end": (34, 21),
            "iter_out": (48, 35), "iter_in": (62, 49), "dst_factor_out": (74, 64),
            "dst_factor_in": (85, 75), "src_factor_out": (96, 86), "src_factor_in": (107, 97),
            "alu_opcode": (110, 108), "use_imm": (111, 111), "imm": (127, 112)},
    "uop": {"dst": (10, 0), "src": (21, 11), "wgt": (31, 22)},
}


@pytest.mark.parametrize("kind", list(PINNED))
def test_pinned_bit_positions(kind):
    lay = getattr(isa.layouts(DEFAULT), kind)
    assert {f.name: (f.msb, f.lsb) for f in lay.fields} == PINNED[kind]


def test_enum_values_match_vta():
    assert [(o.name, o.value) for o in isa.Opcode] == [
        ("LOAD", 0), ("STORE", 1), ("GEMM", 2), ("FINISH", 3), ("ALU", 4)]
    assert [(m.name, m.value) for m in isa.MemType] == [
        ("UOP", 0), ("WGT", 1), ("INP", 2), ("ACC", 3), ("OUT", 4), ("ACC_8BIT", 5)]
    assert [(a.name, a.value) for a in isa.AluOp] == [
        ("MIN", 0), ("MAX", 1), ("ADD", 2), ("SHR", 3), ("MUL", 4)]


def test_single_bits_land_where_pinned():
    # Setting one field to all ones must set exactly its pinned bits.
    for name, (msb, lsb) in PINNED["gemm"].items():
        if name == "opcode":
            continue
        f = isa.layouts(DEFAULT).gemm[name]
        fields = {"iter_out": 0, "iter_in": 0, name: f.max}
        word = isa.encode(isa.GemmInsn(**fields), DEFAULT)
        assert word & ~0b111 == ((1 << (msb + 1)) - (1 << lsb)), name
    word = isa.encode(isa.AluInsn(imm=-1), DEFAULT)
    assert word >> 112 == 0xFFFF and (word >> 108) & 0xF == isa.AluOp.ADD


@pytest.mark.parametrize("name", list(PRESETS))
def test_no_field_straddles_bit_64(name):
    lays = isa.layouts(preset(name))
    for lay in (lays.mem, lays.gemm, lays.alu, lays.finish):
        assert lay.fields[0].lsb == 0
        for f in lay.fields:
            assert f.lsb // 64 == f.msb // 64, (lay.kind, f.name)
            assert f.msb < 128
        spans = sorted((f.lsb, f.msb) for f in lay.fields)
        assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))  # no overlap


def _field_values(lay, draw):
    values = {}
    for f in lay.fields:
        if f.name == "opcode":
            continue
        if f.name == "memory_type":
            values[f.name] = isa.MemType(draw(st.sampled_from(list(isa.MemType))))
        elif f.name == "alu_opcode":
            values[f.name] = isa.AluOp(draw(st.sampled_from(list(isa.AluOp))))
        else:
            values[f.name] = draw(st.integers(f.min, f.max))
    return values


@st.composite
def instructions(draw, cfg):
    lays = isa.layouts(cfg)
    kind = draw(st.sampled_from(["load", "store", "gemm", "alu", "finish"]))
    if kind in ("load", "store"):
        op = isa.Opcode.LOAD if kind == "load" else isa.Opcode.STORE
        return isa.MemInsn(opcode=op, **_field_values(lays.mem, draw))
    if kind == "gemm":
        return isa.GemmInsn(**_field_values(lays.gemm, draw))
    if kind == "alu":
        return isa.AluInsn(**_field_values(lays.alu, draw))
    return isa.FinishInsn(**_field_values(lays.finish, draw))


@pytest.mark.parametrize("name", list(PRESETS))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_round_trip_every_kind(name, data):
    cfg = preset(name)
    insn = data.draw(instructions(cfg))
    word = isa.encode(insn, cfg)
    assert 0 <= word < 1 << 128
    assert isa.decode(word, cfg) == insn
    assert isa.decode(word.to_bytes(16, "little"), cfg) == insn


@pytest.mark.parametrize("name", list(PRESETS))
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_bulk_decode_matches_scalar(name, data):
    cfg = preset(name)
    insns = data.draw(st.lists(instructions(cfg), min_size=1, max_size=40))
    stream = isa.decode_stream(isa.encode_stream(insns, cfg), cfg)
    assert stream.count == len(insns)
    for i, insn in enumerate(insns):
        lay = isa.layouts(cfg).for_opcode(insn.opcode)
        for f in lay.fields:
            assert stream[f.name][i] == int(getattr(insn, f.name)), (i, f.name)
    assert len(stream.malformed()) == 0


@pytest.mark.parametrize("name", list(PRESETS))
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_uop_round_trip(name, data):
    cfg = preset(name)
    lay = isa.layouts(cfg).uop
    uops = data.draw(st.lists(st.builds(
        isa.Uop, st.integers(0, lay["dst"].max), st.integers(0, lay["src"].max),
        st.integers(0, lay["wgt"].max)), max_size=20))
    words = isa.encode_uops(uops, cfg)
    assert words.dtype == np.dtype("<u4") and len(words) == len(uops)
    dst, src, wgt = isa.decode_uops(words, cfg)
    assert [isa.Uop(int(d), int(s), int(w)) for d, s, w in zip(dst, src, wgt)] == uops
    dst2, _, _ = isa.decode_uops(words.tobytes(), cfg)
    assert (dst2 == dst).all()


@pytest.mark.parametrize("insn, message", [
    (isa.GemmInsn(uop_end=1 << 14), r"GEMM field 'uop_end' = 16384 does not fit in 14 bits "
                                    r"\(expected 0..16383\)"),
    (isa.AluInsn(imm=40000), r"ALU field 'imm' = 40000 does not fit in 16 bits "
                             r"\(expected -32768..32767\)"),
    (isa.MemInsn(y_pad_0=16), r"LOAD field 'y_pad_0' = 16 does not fit in 4 bits"),
    (isa.MemInsn(opcode=isa.Opcode.STORE, dram_base=-1),
     r"STORE field 'dram_base' = -1 does not fit in 32 bits \(expected 0..4294967295\)"),
    (isa.GemmInsn(src_factor_in=2048), r"GEMM field 'src_factor_in' = 2048 does not fit in 11"),
])
def test_encode_rejects_overflow(insn, message):
    with pytest.raises(ValueError, match=message):
        isa.encode(insn, DEFAULT)


def test_encode_rejects_wrong_types():
    with pytest.raises(TypeError, match=r"GEMM field 'iter_in': expected an int, got float 2.5"):
        isa.encode(isa.GemmInsn(iter_in=2.5), DEFAULT)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"expected an instruction .* got str"):
        isa.encode("LOAD", DEFAULT)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"GemmInsn cannot have opcode ALU"):
        isa.encode(isa.GemmInsn(opcode=isa.Opcode.ALU), DEFAULT)


def test_decode_rejects_malformed():
    with pytest.raises(ValueError, match=r"malformed instruction: opcode 7 is not one of "
                                         r"LOAD=0, STORE=1, GEMM=2, FINISH=3, ALU=4"):
        isa.decode(7, DEFAULT)
    bad_mem = isa.encode(isa.MemInsn(), DEFAULT) | (7 << 7)
    with pytest.raises(ValueError, match=r"malformed LOAD instruction: memory_type=7 is not one"):
        isa.decode(bad_mem, DEFAULT)
    bad_alu = isa.encode(isa.AluInsn(), DEFAULT) | (7 << 108)
    with pytest.raises(ValueError, match=r"malformed ALU instruction: alu_opcode=7"):
        isa.decode(bad_alu, DEFAULT)
    with pytest.raises(ValueError, match=r"an instruction is 16 bytes, got 15"):
        isa.decode(b"\0" * 15, DEFAULT)
    stream = isa.decode_stream(
        b"".join(w.to_bytes(16, "little") for w in (bad_mem, 3, bad_alu, 6)), DEFAULT)
    assert stream.malformed().tolist() == [0, 2, 3]
    with pytest.raises(ValueError, match=r"whole number of 16-byte instructions, got 20 bytes"):
        isa.decode_stream(b"\0" * 20, DEFAULT)


def test_encode_uops_rejects_overflow():
    with pytest.raises(ValueError, match=r"micro-op 1: field 'wgt' = 1024 does not fit in 10 "
                                         r"bits \(expected 0..1023\)"):
        isa.encode_uops([isa.Uop(0, 0, 0), isa.Uop(0, 0, 1024)], DEFAULT)


def test_signed_imm_in_bulk_decode():
    insns = [isa.AluInsn(imm=v, use_imm=1) for v in (-32768, -1, 0, 1, 32767)]
    stream = isa.decode_stream(isa.encode_stream(insns, DEFAULT), DEFAULT)
    assert stream["imm"].tolist() == [-32768, -1, 0, 1, 32767]
    # fields that a kind lacks read as zero
    assert stream["x_size"].tolist() == [0] * 5
