"""Virtual threads without hand-placed tokens: the standard double-buffering pattern.

A tiled accelerator kernel overlaps loading the next chunk of inputs with computing on the
current one by splitting INP/WGT (and ACC/OUT) into halves, one per *virtual thread*, and
ordering the halves with dependency tokens. :class:`VirtualThreads` emits those tokens; the
kernel says only what it loads, computes and stores::

    vt = VirtualThreads(sess)                   # threads=2; threads=1 is the serial pattern
    for tile in tiles:                          # one ACC half per tile
        with vt.tile() as a:                    # a = the ACC/OUT half (0 or 1)
            for chunk in chunks:
                with vt.load() as b:            # b = the INP/WGT half; LOADs go here
                    ...
                with vt.compute():              # GEMMs on half b into ACC half a
                    ...
            with vt.compute():                  # ALU epilogue on ACC half a (no load needed)
                ...
            with vt.store():                    # STOREs of ACC half a
                ...
    vt.finish()                                 # before synchronize()/finalize()

The tokens (``T`` = threads):

- load chunk ``k`` waits for compute to finish chunk ``k - T`` (COMPUTE→LOAD), then signals
  the compute that uses it (LOAD→COMPUTE);
- the first compute of tile ``t`` waits for the store of tile ``t - T`` (STORE→COMPUTE): its
  ACC/OUT half is free again;
- the store of a tile waits for its compute (COMPUTE→STORE) and, done, frees the half;
- :meth:`finish` pops the last ``T`` tokens of each kind, so a stream ends with every queue
  empty.

Every pop is matched by a push that comes *earlier* in the stream, so the in-order fetch unit
never has to dispatch past a blocked instruction to reach the push it waits for: the pattern
cannot deadlock, whatever the command-queue depth (one-entry queues included). At most ``T``
tokens wait in any dependency queue, so ``T`` may not exceed the configuration's
``dep_queue_depth``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from vtakit.driver.session import Session, Stage

__all__ = ["VirtualThreads"]


class VirtualThreads:
    """Emits the dependency tokens of ``threads`` virtual threads on ``sess`` (see the module).

    Attributes
    ----------
    threads : int
        1 (serial: every load waits for the previous compute) or 2 (double buffering).
    chunks, tiles : int
        Load chunks and tiles begun so far.
    """

    def __init__(self, sess: Session, threads: int = 2):
        if threads not in (1, 2):
            raise ValueError(f"VirtualThreads: threads={threads}; expected 1 or 2")
        if threads > sess.cfg.dep_queue_depth:
            raise ValueError(f"VirtualThreads: {threads} threads need {threads} dependency-queue "
                             f"entries; configuration {sess.cfg.bitstream_name} has "
                             f"{sess.cfg.dep_queue_depth}")
        self.sess, self.threads = sess, threads
        self.chunks = 0
        self.tiles = 0
        self._loaded = False        # a load chunk waits for its compute
        self._in_tile = False
        self._acc_ready = True      # the current tile's ACC half is known to be free
        self._stored = False
        self._finished = False

    def half(self, depth: int, index: int) -> int:
        """First row of half ``index`` of a buffer of ``depth`` rows."""
        return index * (depth // self.threads)

    def _check(self, what: str) -> None:
        if self._finished:
            raise RuntimeError(f"VirtualThreads.{what}: finish() was already called")

    @contextmanager
    def tile(self) -> Iterator[int]:
        """One ACC/OUT half's life: computes into it, then one store out of it. Yields the
        half's index."""
        self._check("tile")
        if self._in_tile:
            raise RuntimeError("VirtualThreads.tile: tiles do not nest")
        index = self.tiles % self.threads
        self._in_tile, self._stored = True, False
        self._acc_ready = self.tiles < self.threads
        self.tiles += 1
        try:
            yield index
        finally:
            self._in_tile = False
        if not self._stored:
            raise RuntimeError("VirtualThreads.tile: a tile ends with a store() of its ACC "
                               "half (the next tile on that half waits for it)")

    @contextmanager
    def load(self) -> Iterator[int]:
        """A chunk of LOADs (INP/WGT) into one half; the next :meth:`compute` uses it. Yields the
        half's index."""
        self._check("load")
        if self._loaded:
            raise RuntimeError("VirtualThreads.load: the previous chunk was not computed on "
                               "(each load() is followed by one compute())")
        index = self.chunks % self.threads
        if self.chunks >= self.threads:
            self.sess.dep_pop(Stage.COMPUTE, Stage.LOAD)  # compute is done with this half
        self.chunks += 1
        yield index
        self._loaded = True

    @contextmanager
    def compute(self) -> Iterator[None]:
        """GEMM/ALU work (and compute-stage loads: micro-ops, ACC) on the current tile's ACC
        half, using the chunk of the preceding :meth:`load` if there is one."""
        self._check("compute")
        if not self._in_tile:
            raise RuntimeError("VirtualThreads.compute: compute runs inside a tile()")
        if self._stored:
            raise RuntimeError("VirtualThreads.compute: the tile was already stored")
        loaded = self._loaded
        if loaded:
            self.sess.dep_push(Stage.LOAD, Stage.COMPUTE)
            self.sess.dep_pop(Stage.LOAD, Stage.COMPUTE)
        self._wait_acc()
        yield
        if loaded:
            self.sess.dep_push(Stage.COMPUTE, Stage.LOAD)
            self._loaded = False

    def _wait_acc(self) -> None:
        if not self._acc_ready:
            self.sess.dep_pop(Stage.STORE, Stage.COMPUTE)  # the store of tile - T is done
            self._acc_ready = True

    @contextmanager
    def store(self) -> Iterator[None]:
        """The STOREs of the tile's OUT half, after everything computed into it."""
        self._check("store")
        if not self._in_tile or self._stored:
            raise RuntimeError("VirtualThreads.store: one store() per tile(), inside it")
        if self._loaded:
            raise RuntimeError("VirtualThreads.store: a loaded chunk was never computed on")
        self._wait_acc()
        self.sess.dep_push(Stage.COMPUTE, Stage.STORE)
        self.sess.dep_pop(Stage.COMPUTE, Stage.STORE)
        yield
        self.sess.dep_push(Stage.STORE, Stage.COMPUTE)
        self._stored = True

    def finish(self) -> None:
        """Pop the tokens still queued (the last ``threads`` chunks and tiles)."""
        self._check("finish")
        if self._in_tile or self._loaded:
            raise RuntimeError("VirtualThreads.finish: a tile or a loaded chunk is still open")
        for _ in range(min(self.chunks, self.threads)):
            self.sess.dep_pop(Stage.COMPUTE, Stage.LOAD)
        for _ in range(min(self.tiles, self.threads)):
            self.sess.dep_pop(Stage.STORE, Stage.COMPUTE)
        self._finished = True
