"""The interfaces between the core's units, as ``amaranth.lib.wiring`` signatures.

``top.py`` joins units with ``wiring.connect(m, a, b)``; each signature is written from the side
that starts the conversation (``Out`` members are driven by it, ``In`` members by the other
side, which declares the signature with ``In(...)`` or ``flipped``):

* :class:`MemClientSignature`: a unit's client of the shared memory port (docs/timing.md §2),
  read (fetch, compute, load) or write (store);
* :class:`MemBusSignature`: the port's burst memory interface (the core's ``mem_*`` ports);
* :class:`CommandWriteSignature`: fetch writing into a command queue;
* :class:`CommandSignature`: a command queue's head, offered to its unit;
* :class:`TokenPushSignature`, :class:`TokenPopSignature`: a unit pushing into or popping from
  a dependency-token queue;
* :class:`SramWriteSignature`: the write lanes a DMA drives into one on-chip buffer.

Example: the load unit's memory client and the port's ``load`` client are one connection::

    wiring.connect(m, load.mem, port.load)   # load.mem: Out(MemClientSignature(cfg))
"""

from __future__ import annotations

from amaranth.hdl import unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw.config import HwConfig

__all__ = ["ADDR_BITS", "MemClientSignature", "MemBusSignature", "CommandWriteSignature",
           "CommandSignature", "TokenPushSignature", "TokenPopSignature", "SramWriteSignature"]

ADDR_BITS = 32  # DRAM byte addresses


def _check_cfg(who: str, cfg: HwConfig) -> None:
    if not isinstance(cfg, HwConfig):
        raise TypeError(f"{who}: cfg must be an HwConfig, got {type(cfg).__name__}")


def _check_width(who: str, width_bits: int) -> None:
    if not isinstance(width_bits, int) or isinstance(width_bits, bool) or width_bits < 1:
        raise ValueError(f"{who}: {width_bits!r} must be a positive int")


class MemClientSignature(wiring.Signature):
    """One client of the shared memory port, seen from the client.

    The client holds ``req`` high with the byte address ``addr`` and length ``beats`` of its
    next burst while it has one; ``grant`` is high in the cycle the port takes it. A reader gets
    its beats on ``rd_data`` in the cycles ``rd_valid`` is high; the writer supplies
    ``wr_data``/``wr_strb`` in the cycles ``wr_beat`` is high (the port sends a beat of its
    burst then).

    Parameters
    ----------
    cfg : HwConfig
        Bus width and longest burst.
    write : bool
        The write client (the store unit) instead of a reader.
    """

    def __init__(self, cfg: HwConfig, *, write: bool = False):
        _check_cfg("MemClientSignature", cfg)
        self.cfg, self.write = cfg, bool(write)
        members = {"req": Out(1), "addr": Out(ADDR_BITS),
                   "beats": Out(range(1, cfg.mem_max_burst_beats + 1)), "grant": In(1)}
        if write:
            members.update({"wr_beat": In(1), "wr_data": Out(cfg.bus_width_bits),
                            "wr_strb": Out(cfg.bus_bytes)})
        else:
            members.update({"rd_valid": In(1), "rd_data": In(cfg.bus_width_bits)})
        super().__init__(members)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, MemClientSignature) and other.cfg == self.cfg
                and other.write == self.write)

    def __hash__(self) -> int:
        return hash((type(self), self.cfg, self.write))

    def __repr__(self) -> str:
        return f"MemClientSignature({self.cfg.bitstream_name}, write={self.write})"


class MemBusSignature(wiring.Signature):
    """The burst memory interface, seen from the core (docs/hardware.md; the core's ``mem_*``
    ports without the prefix): read bursts ``rd_*`` whose beats come back on ``rd_data`` ``L``
    cycles after the cycle that sent them, and posted write bursts ``wr_*``.

    Parameters
    ----------
    cfg : HwConfig
    """

    def __init__(self, cfg: HwConfig):
        _check_cfg("MemBusSignature", cfg)
        self.cfg = cfg
        beats = range(1, cfg.mem_max_burst_beats + 1)
        super().__init__({
            "rd_valid": Out(1), "rd_addr": Out(ADDR_BITS), "rd_beats": Out(beats),
            "rd_data_valid": In(1), "rd_data": In(cfg.bus_width_bits),
            "wr_valid": Out(1), "wr_addr": Out(ADDR_BITS), "wr_beats": Out(beats),
            "wr_data_valid": Out(1), "wr_data": Out(cfg.bus_width_bits),
            "wr_strb": Out(cfg.bus_bytes),
        })

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MemBusSignature) and other.cfg == self.cfg

    def __hash__(self) -> int:
        return hash((type(self), self.cfg))

    def __repr__(self) -> str:
        return f"MemBusSignature({self.cfg.bitstream_name})"


class CommandWriteSignature(wiring.Signature):
    """Writing into a command queue, seen from the writer (fetch): ``en`` with ``data`` puts a
    command in; the writer checks ``full`` first.

    Parameters
    ----------
    width_bits : int
        Bits of one command (``isa.INSN_WIDTH_BITS`` for instructions).
    """

    def __init__(self, width_bits: int):
        _check_width("CommandWriteSignature", width_bits)
        self.width_bits = width_bits
        super().__init__({"en": Out(1), "data": Out(width_bits), "full": In(1)})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CommandWriteSignature) and other.width_bits == self.width_bits

    def __hash__(self) -> int:
        return hash((type(self), self.width_bits))

    def __repr__(self) -> str:
        return f"CommandWriteSignature({self.width_bits})"


class CommandSignature(wiring.Signature):
    """A command queue's head, seen from the queue: ``valid`` and ``data`` offer it, the unit
    takes it with ``take``.

    With ``snoop`` (a one-entry queue) the queue also shows what is being written into it,
    ``w_en`` and ``w_data``, so the unit can keep its instruction register in step with the
    queue (:mod:`vtakit.vta_hw.control`).

    Parameters
    ----------
    width_bits : int
    snoop : bool
    """

    def __init__(self, width_bits: int, *, snoop: bool = False):
        _check_width("CommandSignature", width_bits)
        self.width_bits, self.snoop = width_bits, bool(snoop)
        members = {"valid": Out(1), "data": Out(width_bits), "take": In(1)}
        if snoop:
            members.update({"w_en": Out(1), "w_data": Out(width_bits)})
        super().__init__(members)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, CommandSignature) and other.width_bits == self.width_bits
                and other.snoop == self.snoop)

    def __hash__(self) -> int:
        return hash((type(self), self.width_bits, self.snoop))

    def __repr__(self) -> str:
        return f"CommandSignature({self.width_bits}, snoop={self.snoop})"


class TokenPushSignature(wiring.Signature):
    """Pushing into a dependency-token queue, seen from the producing unit: ``push`` (only when
    ``can_push``)."""

    def __init__(self) -> None:
        super().__init__({"push": Out(1), "can_push": In(1)})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TokenPushSignature)

    def __hash__(self) -> int:
        return hash(TokenPushSignature)

    def __repr__(self) -> str:
        return "TokenPushSignature()"


class TokenPopSignature(wiring.Signature):
    """Popping from a dependency-token queue, seen from the consuming unit: ``pop`` (only when
    ``avail``)."""

    def __init__(self) -> None:
        super().__init__({"pop": Out(1), "avail": In(1)})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TokenPopSignature)

    def __hash__(self) -> int:
        return hash(TokenPopSignature)

    def __repr__(self) -> str:
        return "TokenPopSignature()"


class SramWriteSignature(wiring.Signature):
    """Write lanes into one on-chip buffer, seen from the writer: lane ``k`` writes ``data[k]``
    to element ``addr + k`` when ``en[k]``.

    Parameters
    ----------
    elem_bits : int
        Bits of one element.
    lanes : int
        Elements per cycle.
    idx_bits : int
        Bits of ``addr``.
    """

    def __init__(self, elem_bits: int, lanes: int, idx_bits: int):
        for name, v in (("elem_bits", elem_bits), ("lanes", lanes), ("idx_bits", idx_bits)):
            _check_width(f"SramWriteSignature {name}", v)
        self.elem_bits, self.lanes, self.idx_bits = elem_bits, lanes, idx_bits
        super().__init__({"en": Out(data.ArrayLayout(1, lanes)), "addr": Out(idx_bits),
                          "data": Out(data.ArrayLayout(unsigned(elem_bits), lanes))})

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, SramWriteSignature) and other.elem_bits == self.elem_bits
                and other.lanes == self.lanes and other.idx_bits == self.idx_bits)

    def __hash__(self) -> int:
        return hash((SramWriteSignature, self.elem_bits, self.lanes, self.idx_bits))

    def __repr__(self) -> str:
        return f"SramWriteSignature({self.elem_bits}, {self.lanes}, {self.idx_bits})"
