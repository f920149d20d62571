"""A deliberately naive, cycle-by-cycle reading of docs/timing.md, written independently of
vta_sim's event-driven units, for cross-checking cycle counts on small programs.

Every cycle: fetch dispatches (it sees command-queue occupancy from the start of the cycle),
then the units act until nothing changes (pushes are visible in the cycle they happen; freed
queue slots only from the next cycle), then the memory port grants one burst if it is free.
"""

from __future__ import annotations

from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.isa import Opcode

INSN = 16
# The timing rules below are restated from the page on purpose (an independent reading); sizes
# are the configuration's (HwConfig.elem_bytes is docs/timing.md's E).
PRIO = ["fetch", "compute", "load", "store"]
POP = {"load": {"pop_next": "g2l"}, "compute": {"pop_prev": "l2g", "pop_next": "s2g"},
       "store": {"pop_prev": "g2s"}}
PUSH = {"load": {"push_next": "l2g"}, "compute": {"push_prev": "g2l", "push_next": "g2s"},
        "store": {"push_prev": "s2g"}}


def bursts_of(rows: list[tuple[int, int]], bus: int, max_beats: int) -> list[int]:
    out = []
    for a, n in rows:
        b, last = a // bus, (a + n - 1) // bus
        while b <= last:
            end = min(last, (b // max_beats + 1) * max_beats - 1)
            out.append(end - b + 1)
            b = end + 1
    return out


class Xfer:
    def __init__(self, bursts: list[int], write: bool):
        self.bursts = list(bursts)
        self.write = write
        self.finish: int | None = None


def cycles(insns: list[dict], units: list[str], cfg: HwConfig, insn_addr: int,
           limit: int = 10**6) -> int:
    L, W, M = cfg.mem_read_latency_cycles, cfg.bus_bytes, cfg.mem_max_burst_beats
    n = len(insns)
    queue = {u: [] for u in POP}  # (visible cycle, index)
    tokens = dict.fromkeys(("l2g", "g2l", "g2s", "s2g"), 0)
    port_free = 0
    requests: dict[str, Xfer] = {}
    # fetch: requests a group at f_req_at, dispatches it once read, one instruction a cycle
    window = M * W
    f_next, f_req_at = 0, 0
    f_xfer: Xfer | None = None
    f_group = (0, 0)
    f_dispatch: int | None = None
    # units: state in {"idle", "tokens", "busy", "push"}
    st = {u: {"state": "idle", "k": None, "finish": None, "xfer": None, "pad": 0}
          for u in POP}
    for c in range(limit):
        freed = dict.fromkeys(tokens, 0)
        # -- fetch
        if f_req_at == c and f_next < n:
            a = insn_addr + f_next * INSN
            room = (a // window + 1) * window - a
            f_group = (f_next, min(n, f_next + max(1, -(-room // INSN))))
            f_xfer = Xfer(bursts_of([(a, (f_group[1] - f_next) * INSN)], W, M), False)
            requests["fetch"] = f_xfer
        if f_xfer is not None and f_xfer.finish is not None and f_xfer.finish <= c:
            f_xfer, f_dispatch = None, f_group[0]
        if f_dispatch is not None:
            u = units[f_dispatch]
            if len(queue[u]) < cfg.cmd_queue_depth:
                queue[u].append((c + 1, f_dispatch))
                f_dispatch += 1
                if f_dispatch == f_group[1]:
                    f_next, f_dispatch, f_req_at = f_group[1], None, c + 1
        # -- units, to a fixed point
        changed = True
        while changed:
            changed = False
            for u, s in st.items():
                if s["state"] == "busy":
                    x = s["xfer"]
                    if x is not None and x.finish is not None and s["finish"] is None:
                        s["finish"] = x.finish + s["pad"]
                    if s["finish"] is not None and s["finish"] <= c:
                        s["state"] = "push"
                        changed = True
                if s["state"] == "push":
                    insn = insns[s["k"]]
                    qs = [q for f, q in PUSH[u].items() if insn[f]]
                    if all(tokens[q] + freed[q] < cfg.dep_queue_depth for q in qs):
                        for q in qs:
                            tokens[q] += 1
                        if insn["opcode"] == Opcode.FINISH:
                            return c
                        s.update(state="idle", k=None, finish=None, xfer=None, pad=0)
                        changed = True
                if s["state"] == "idle" and queue[u] and queue[u][0][0] <= c:
                    s["k"] = queue[u].pop(0)[1]
                    s["state"] = "tokens"
                    changed = True
                if s["state"] == "tokens":
                    insn = insns[s["k"]]
                    qs = [q for f, q in POP[u].items() if insn[f]]
                    if all(tokens[q] > 0 for q in qs):
                        for q in qs:
                            tokens[q] -= 1
                            freed[q] += 1
                        start(s, u, insn, c, cfg, requests)
                        changed = True
        for u, s in st.items():
            if s.get("req_at") == c:
                requests[u] = s["xfer"]
                s["req_at"] = None
        # -- memory port
        if port_free <= c:
            for client in PRIO:
                x = requests.get(client)
                if x is not None and x.bursts:
                    k = x.bursts.pop(0)
                    port_free = c + k
                    if not x.bursts:
                        x.finish = c + k + (0 if x.write else L)
                        del requests[client]
                    break
    raise AssertionError("cycle model: no FINISH within the limit")


def start(s: dict, u: str, insn: dict, c: int, cfg: HwConfig, requests: dict) -> None:
    s["state"] = "busy"
    op = insn["opcode"]
    if op in (Opcode.LOAD, Opcode.STORE):
        x, y = insn["x_size"], insn["y_size"]
        if x == 0:
            s["finish"] = c + 1
            return
        eb = cfg.elem_bytes(insn["memory_type"])
        pad = 0
        if op == Opcode.LOAD:
            rows = insn["y_pad_0"] + y + insn["y_pad_1"]
            cols = insn["x_pad_0"] + x + insn["x_pad_1"]
            pad = rows * cols - x * y
        if y == 0:  # a LOAD's padding from s + 2 (chosen from the DMA's register at s + 1)
            s["finish"] = (c + 1 if op == Opcode.STORE else c + 2 + pad)
            return
        rows_ = [((insn["dram_base"] + r * insn["x_stride"]) * eb, x * eb) for r in range(y)]
        s["xfer"] = Xfer(bursts_of(rows_, cfg.bus_bytes, cfg.mem_max_burst_beats),
                         op == Opcode.STORE)
        s["pad"] = pad
        s["req_at"] = c + 2  # docs/timing.md §4: a LOAD or STORE requests the port at s + 2
        return
    if op in (Opcode.GEMM, Opcode.ALU):
        nu = max(0, insn["uop_end"] - insn["uop_bgn"]) * insn["iter_out"] * insn["iter_in"]
        per = 1 if op == Opcode.GEMM or insn["use_imm"] else 2
        fill = 6 if op == Opcode.GEMM else 5  # docs/timing.md §4: s + n + 6, s + n + 5
        s["finish"] = c + (nu * per + fill if nu else 1)
        return
    s["finish"] = c + 1
