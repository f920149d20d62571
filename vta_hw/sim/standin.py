"""A stand-in ``vta_core`` for testing the harness itself (not the accelerator).

It speaks the real core's port protocol but only walks its "instruction stream" as raw bus
words: for each ``M*W``-byte aligned chunk it issues one read burst, collects the beats, then
writes every word back incremented by one (all byte strobes set) in one write burst. ``cycles``
reports the cycle at which it finished, counted like the real core (cycle 0 is the cycle after
``start``). ``insn_count`` with bit 31 set makes it issue a misaligned read (to test that the
DRAM model catches protocol violations); bit 30 makes it issue a read burst while the previous
one still holds the port.
"""

from __future__ import annotations

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig

__all__ = ["standin_core_verilog"]


def standin_core_verilog(cfg: HwConfig) -> str:
    W, M, wb = cfg.bus_width_bits, cfg.mem_max_burst_beats, cfg.bus_bytes
    bw = M.bit_length()
    lw = (wb - 1).bit_length()
    return f"""// A stand-in vta_core for harness tests (vtakit.vta_hw.sim.standin).
module vta_core (
  input clk, input rst, input start, input [31:0] insn_addr, input [31:0] insn_count,
  output reg done, output reg [31:0] cycles, output [31:0] hw_ver, output [31:0] hw_id,
  output reg mem_rd_valid, output reg [31:0] mem_rd_addr, output reg [{bw - 1}:0] mem_rd_beats,
  input mem_rd_data_valid, input [{W - 1}:0] mem_rd_data,
  output reg mem_wr_valid, output reg [31:0] mem_wr_addr, output reg [{bw - 1}:0] mem_wr_beats,
  output reg mem_wr_data_valid, output reg [{W - 1}:0] mem_wr_data,
  output [{wb - 1}:0] mem_wr_strb
);
  assign hw_ver = 32'h{(isa.HW_VER[0] << 16) | (isa.HW_VER[1] << 8) | isa.HW_VER[2]:08x};
  assign hw_id = 32'h{cfg.hash_u32:08x};
  assign mem_wr_strb = {{{wb}{{1'b1}}}};
  localparam M = {M};
  reg [{W - 1}:0] buf_ [0:M-1];
  reg [2:0] state;  // 0 idle, 1 issue read, 2 collect, 3 write, 4 done
  reg [31:0] cur, last, t;
  reg [{bw}:0] k, n;
  reg bad_align, bad_overlap;
  // beats of the chunk starting at word cur: up to the next M-word boundary or the end
  wire [31:0] cur_w = cur >> {lw};
  wire [31:0] left = (last - cur) >> {lw};
  wire [31:0] to_edge = M - (cur_w % M);
  wire [{bw}:0] chunk = left < to_edge ? left[{bw}:0] : to_edge[{bw}:0];
  always @(posedge clk) begin
    mem_rd_valid <= 0; mem_wr_valid <= 0; mem_wr_data_valid <= 0;
    t <= t + 1;
    if (rst) begin
      state <= 0; done <= 0; cycles <= 0;
    end else case (state)
      0, 5: if (start) begin
        cur <= insn_addr; last <= insn_addr + insn_count[29:0] * {isa.INSN_BYTES};
        bad_align <= insn_count[31]; bad_overlap <= insn_count[30];
        done <= 0; t <= 0; state <= 1;
      end
      1: begin
        mem_rd_valid <= 1; mem_rd_addr <= cur | (bad_align ? 32'd1 : 32'd0);
        mem_rd_beats <= chunk[{bw - 1}:0]; n <= chunk; k <= 0; state <= 2;
      end
      2: begin
        if (bad_overlap && chunk > 1) begin
          mem_rd_valid <= 1; mem_rd_addr <= cur; mem_rd_beats <= 1; bad_overlap <= 0;
        end
        if (mem_rd_data_valid) begin
          buf_[k[{bw - 1}:0]] <= mem_rd_data; k <= k + 1;
          if (k + 1 == n) begin k <= 0; state <= 3; end
        end
      end
      3: begin
        if (k == 0) begin
          mem_wr_valid <= 1; mem_wr_addr <= cur; mem_wr_beats <= n[{bw - 1}:0];
        end
        mem_wr_data_valid <= 1; mem_wr_data <= buf_[k[{bw - 1}:0]] + 1; k <= k + 1;
        if (k + 1 == n) begin
          cur <= cur + (n << {lw});
          state <= (cur + (n << {lw}) >= last) ? 4 : 1;
        end
      end
      4: begin
        // one idle cycle so that the last write beat (registered) has gone out
        done <= 1; cycles <= t + 1; state <= 5;
      end
      default: ;
    endcase
  end
endmodule
"""
