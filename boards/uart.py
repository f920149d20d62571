"""A small 8N1 UART: :class:`UartRx` and :class:`UartTx`, ``divisor`` clock cycles per bit.

The receiver synchronises the line through two flip-flops, takes a low level seen for half a
bit as a start bit, samples each data bit in its middle (least significant bit first) and
checks the stop bit: high delivers the byte (``o.valid`` for one cycle), low raises ``error``
for one cycle and waits for the line to go high again before it looks for the next start bit
(a break, or a sender at another baud rate). The transmitter sends one byte per ``i``
transfer: start bit, 8 data bits, stop bit, ``divisor`` cycles each; the line idles high.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["UartRx", "UartTx", "uart_divisor", "MIN_DIVISOR"]

#: Fewest clock cycles per bit: the receiver needs half a bit to centre on the start bit after
#: its two-flop synchroniser.
MIN_DIVISOR = 4


def uart_divisor(clk_hz: int, baud: int) -> int:
    """Clock cycles per bit for ``baud`` at ``clk_hz``: ``round(clk_hz / baud)``.

    ``ValueError`` if it is below :data:`MIN_DIVISOR` or the resulting rate is more than 2%
    off ``baud`` (a receiver samples the last bit wrongly beyond about 4%, split between the
    two ends)."""
    for name, v in (("clk_hz", clk_hz), ("baud", baud)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name}={v!r}: expected a positive int")
    divisor = round(clk_hz / baud)
    if divisor < MIN_DIVISOR:
        raise ValueError(f"clk_hz={clk_hz}, baud={baud}: {clk_hz / baud:.2f} clock cycles per "
                         f"bit; expected at least {MIN_DIVISOR} (lower the baud rate or raise "
                         f"the clock)")
    error = abs(clk_hz / divisor - baud) / baud
    if error > 0.02:
        raise ValueError(f"clk_hz={clk_hz}, baud={baud}: the nearest divisor {divisor} gives "
                         f"{clk_hz / divisor:.0f} baud, {error:.1%} off; expected within 2% "
                         f"(choose a baud rate closer to clk_hz / n)")
    return divisor


def _check_divisor(cls: str, divisor: int) -> int:
    if isinstance(divisor, bool) or not isinstance(divisor, int) or divisor < MIN_DIVISOR:
        raise ValueError(f"{cls}: divisor={divisor!r}; expected an int >= {MIN_DIVISOR} "
                         f"(clock cycles per bit)")
    return divisor


class UartRx(wiring.Component):
    """UART receiver, 8 data bits, no parity, one stop bit.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit (at least :data:`MIN_DIVISOR`; :func:`uart_divisor`).

    Attributes
    ----------
    line : In(1)
        The serial line (asynchronous; idles high).
    o : Out(stream.Signature(8, always_ready=True))
        One transfer per byte received, in the cycle after its stop bit's middle.
    error : Out(1)
        A one-cycle pulse instead of ``o.valid`` when the stop bit was low.
    """

    def __init__(self, divisor: int):
        self.divisor = _check_divisor("UartRx", divisor)
        super().__init__({
            "line": In(1, init=1),
            "o": Out(stream.Signature(8, always_ready=True)),
            "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        d = self.divisor
        meta, line = Signal(init=1), Signal(init=1)  # two-flop synchroniser
        m.d.sync += [meta.eq(self.line), line.eq(meta)]
        timer = Signal(range(d))
        # data bits enter at the top; a 1 loaded above them marks how far they have come:
        # when it reaches bit 0, bits 1-8 hold the byte and the next sample is the stop bit
        shreg = Signal(9)
        m.d.sync += [self.o.valid.eq(0), self.error.eq(0)]
        m.d.comb += self.o.payload.eq(shreg[1:])
        with m.FSM():
            with m.State("IDLE"):
                with m.If(~line):
                    m.d.sync += timer.eq(d // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(line):
                    m.next = "IDLE"  # a glitch shorter than half a bit
                with m.Else():
                    m.d.sync += [timer.eq(d - 1), shreg.eq(1 << 8)]
                    m.next = "DATA"
            with m.State("DATA"):  # 8 data bits, then the stop bit
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(~shreg[0]):
                    m.d.sync += [shreg.eq(Cat(shreg[1:], line)), timer.eq(d - 1)]
                with m.Elif(line):
                    m.d.sync += self.o.valid.eq(1)
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += self.error.eq(1)
                    m.next = "BREAK"
            with m.State("BREAK"):
                with m.If(line):
                    m.next = "IDLE"
        return m


class UartTx(wiring.Component):
    """UART transmitter, 8 data bits, no parity, one stop bit.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit (at least :data:`MIN_DIVISOR`).

    Attributes
    ----------
    i : In(stream.Signature(8))
        A byte to send; ``ready`` while the transmitter is idle (after the previous stop bit).
    line : Out(1)
        The serial line (registered; idles high).
    """

    def __init__(self, divisor: int):
        self.divisor = _check_divisor("UartTx", divisor)
        super().__init__({
            "i": In(stream.Signature(8)),
            "line": Out(1, init=1),
        })

    def elaborate(self, platform):
        m = Module()
        d = self.divisor
        timer = Signal(range(d))
        left = Signal(range(11))
        shreg = Signal(10)
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    # start bit, data LSB first, stop bit
                    m.d.sync += [shreg.eq(Cat(Const(0, 1), self.i.payload, Const(1, 1))),
                                 left.eq(10), timer.eq(0)]
                    m.next = "SEND"
            with m.State("SEND"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(left != 0):
                    m.d.sync += [self.line.eq(shreg[0]), shreg.eq(shreg >> 1),
                                 left.eq(left - 1), timer.eq(d - 1)]
                with m.Else():
                    m.next = "IDLE"
        return m
