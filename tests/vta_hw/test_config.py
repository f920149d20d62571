import dataclasses
import json

import pytest

from vtakit.vta_hw.config import PRESETS, HwConfig, preset


def test_default_is_vta_pynq():
    cfg = preset("default")
    assert (cfg.log_inp_width, cfg.log_wgt_width, cfg.log_acc_width, cfg.log_batch,
            cfg.log_block_in, cfg.log_block_out, cfg.log_uop_buff_size, cfg.log_inp_buff_size,
            cfg.log_wgt_buff_size, cfg.log_acc_buff_size) == (3, 3, 5, 0, 4, 4, 15, 15, 18, 17)
    assert cfg.bus_width_bits == 64 and cfg.clock_mhz == 100
    assert cfg.bitstream_name == "1x16x16_i8w8a32_15_15_18_17"


@pytest.mark.parametrize("prop, value", [
    ("batch", 1), ("block_in", 16), ("block_out", 16), ("macs_per_cycle", 256),
    ("inp_elem_bytes", 16), ("wgt_elem_bytes", 256), ("acc_elem_bytes", 64),
    ("out_elem_bytes", 16), ("uop_elem_bytes", 4),
    ("inp_depth", 2048), ("wgt_depth", 1024), ("acc_depth", 2048), ("out_depth", 2048),
    ("uop_depth", 8192), ("log_uop_depth", 13), ("log_inp_depth", 11), ("log_wgt_depth", 10),
    ("log_acc_depth", 11), ("log_out_buff_size", 15), ("bus_bytes", 8), ("peak_gops", 51.2),
])
def test_default_derived_sizes(prop, value):
    assert getattr(preset("default"), prop) == value


def test_ecp5_fits_the_part():
    cfg = preset("ecp5")
    assert cfg.macs_per_cycle == 64 <= 156  # one MULT18X18D per int8 multiplier
    ebr_bytes = 208 * 18 * 1024 // 8 * 16 // 18  # 208 EBRs of 16 data kbit each
    total = (cfg.uop_buff_bytes + cfg.inp_buff_bytes + cfg.wgt_buff_bytes
             + cfg.acc_buff_bytes + cfg.out_buff_bytes)
    assert total <= ebr_bytes // 2  # leaves half of the block RAM for queues and the SoC


def test_ice40_fits_the_part():
    cfg = preset("ice40")
    assert cfg.macs_per_cycle <= 8  # DSPs of the UP5K
    assert cfg.acc_buff_bytes + cfg.wgt_buff_bytes <= 128 * 1024  # SPRAM
    ebr_bytes = 30 * 4096 // 8
    assert cfg.uop_buff_bytes + cfg.inp_buff_bytes + cfg.out_buff_bytes <= ebr_bytes


def test_large_is_32x32():
    cfg = preset("large")
    assert (cfg.block_in, cfg.block_out) == (32, 32)


@pytest.mark.parametrize("name", list(PRESETS))
def test_json_round_trip(name):
    cfg = preset(name)
    back = HwConfig.from_json(cfg.to_json())
    assert back == cfg and back.hash == cfg.hash


def test_hash_is_stable_and_distinguishes():
    # The hash goes into artifacts and the hardware ID register: it must not change silently.
    assert preset("default").hash == "eb4589e8"
    hashes = {preset(n).hash for n in PRESETS}
    assert len(hashes) == len(PRESETS)
    assert preset("default").replace(clock_mhz=150).hash != preset("default").hash
    assert preset("default").hash_u32 == int(preset("default").hash, 16)


def test_from_dict_accepts_vta_config_json():
    vta = {"TARGET": "sim", "HW_VER": "0.0.2", "LOG_INP_WIDTH": 3, "LOG_WGT_WIDTH": 3,
           "LOG_ACC_WIDTH": 5, "LOG_BATCH": 0, "LOG_BLOCK": 4, "LOG_UOP_BUFF_SIZE": 15,
           "LOG_INP_BUFF_SIZE": 15, "LOG_WGT_BUFF_SIZE": 18, "LOG_ACC_BUFF_SIZE": 17}
    assert HwConfig.from_dict(vta) == preset("default")


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        preset("default").log_batch = 1  # type: ignore[misc]


@pytest.mark.parametrize("changes, message", [
    ({"log_inp_width": 2}, r"log_inp_width=2 is not supported: .*\(expected log_inp_width=3\)"),
    ({"log_acc_width": 4}, r"log_acc_width=4 is not supported"),
    ({"log_block_in": 7}, r"log_block_in=7 is out of range \(expected 0 <= log_block_in <= 6\)"),
    ({"log_batch": -1}, r"log_batch=-1 is out of range"),
    ({"mem_max_burst_beats": 12}, r"mem_max_burst_beats=12 is not a power of two"),
    ({"cmd_queue_depth": 0}, r"cmd_queue_depth=0 is out of range"),
    ({"log_wgt_buff_size": 7},
     r"log_wgt_buff_size=7 gives a 128-byte WGT buffer, too small for one 256-byte tile .*"
     r"expected log_wgt_buff_size >= 8"),
    # a 2^16-row accumulator needs 16-bit indices, which overflow the upper 64-bit word
    ({"log_acc_buff_size": 22},
     r"GEMM fields do not fit in 128 bits: 'wgt_factor_in' would end at bit 137. Index widths "
     r"of this configuration: .*dst_factor_out 16 bits \(from log_acc_buff_size"),
    ({"log_uop_buff_size": 18},
     r"GEMM fields do not fit in 128 bits: .* uop_bgn 16 bits \(from log_uop_buff_size\)"),
    ({"log_inp_buff_size": 24}, r"a buffer has 2\^20 elements but sram_base is 16 bits"),
])
def test_validate_names_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        preset("default").replace(**changes)


def test_validate_rejects_wrong_types():
    with pytest.raises(TypeError, match=r"HwConfig.log_batch: expected an int, got float 0.5"):
        HwConfig(log_batch=0.5).validate()  # type: ignore[arg-type]


@pytest.mark.parametrize("text, message", [
    ("{", r"HwConfig: not valid JSON"),
    ("[1, 2]", r"HwConfig: expected a JSON object, got list"),
    ('{"log_blok_in": 4}', r"HwConfig: unknown field 'log_blok_in' \(expected one of"),
    ('{"HW_VER": "0.0.1"}', r"HW_VER='0.0.1' is not supported \(expected '0.0.2'\)"),
])
def test_from_json_errors(text, message):
    with pytest.raises((TypeError, ValueError), match=message):
        HwConfig.from_json(text)


def test_unknown_preset():
    with pytest.raises(ValueError, match=r"unknown hardware configuration 'pynq' \(expected "
                                         r"one of default, ecp5, ecp5-16x16, ice40, large\)"):
        preset("pynq")


def test_json_is_plain_fields():
    data = json.loads(preset("default").to_json())
    assert data["log_block_in"] == 4 and "batch" not in data
