"""Run statistics: cycles, per-unit busy/stall time, MACs, DRAM traffic, instruction mix."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SimStats", "UnitStats", "UNITS"]

UNITS = ("fetch", "load", "compute", "store")


@dataclass
class UnitStats:
    """Cycles one unit spent executing (``busy_cycles``) and waiting for a dependency token,
    for space in a token or command queue (``stall_cycles``); ``insns`` it executed."""

    busy_cycles: int = 0
    stall_cycles: int = 0
    insns: int = 0


@dataclass
class SimStats:
    """What one run did.

    Attributes
    ----------
    cycles : int
        Total cycles, from the start of the run to the cycle after FINISH completed (0 when
        the run had timing off).
    timing : bool
        Whether the run was timed.
    macs_per_cycle : int
        Peak of the configuration (``cfg.macs_per_cycle``).
    units : dict[str, UnitStats]
        ``fetch``, ``load``, ``compute``, ``store`` (busy/stall stay 0 with timing off).
    gemm_uops, gemm_macs, alu_uops : int
        Micro-op iterations executed (GEMM with reset counts as GEMM micro-ops but no MACs).
    dram_read_bytes : dict[str, int]
        Payload bytes read per memory type (``INSN`` for instruction fetch).
    dram_write_bytes : int
        Payload bytes stored.
    insn_counts : dict[str, int]
        Instructions executed per opcode name.
    """

    cycles: int = 0
    timing: bool = True
    macs_per_cycle: int = 1
    units: dict[str, UnitStats] = field(default_factory=lambda: {u: UnitStats() for u in UNITS})
    gemm_uops: int = 0
    gemm_macs: int = 0
    alu_uops: int = 0
    dram_read_bytes: dict[str, int] = field(default_factory=dict)
    dram_write_bytes: int = 0
    insn_counts: dict[str, int] = field(default_factory=dict)

    @property
    def mac_utilisation(self) -> float:
        """MACs / (cycles * macs_per_cycle); 0.0 for an untimed run."""
        if not self.cycles:
            return 0.0
        return self.gemm_macs / (self.cycles * self.macs_per_cycle)

    def summary(self) -> str:
        """A plain-text table of every statistic."""
        lines = [f"cycles            {self.cycles:>14,}" + ("" if self.timing
                                                             else "  (timing off)"),
                 f"GEMM micro-ops    {self.gemm_uops:>14,}",
                 f"MACs              {self.gemm_macs:>14,}",
                 f"MAC utilisation   {100 * self.mac_utilisation:>13.2f}%",
                 f"ALU micro-ops     {self.alu_uops:>14,}",
                 "",
                 f"{'unit':<10}{'insns':>10}{'busy':>14}{'stall':>14}{'busy %':>9}"]
        for name, u in self.units.items():
            pct = 100 * u.busy_cycles / self.cycles if self.cycles else 0.0
            lines.append(f"{name:<10}{u.insns:>10,}{u.busy_cycles:>14,}{u.stall_cycles:>14,}"
                         f"{pct:>8.1f}%")
        lines += ["", f"{'DRAM':<10}{'bytes':>14}"]
        for name, n in sorted(self.dram_read_bytes.items()):
            lines.append(f"read {name:<5}{n:>14,}")
        lines.append(f"write OUT {self.dram_write_bytes:>14,}")
        lines += ["", f"{'opcode':<10}{'count':>10}"]
        for name, n in sorted(self.insn_counts.items()):
            lines.append(f"{name:<10}{n:>10,}")
        return "\n".join(lines)
