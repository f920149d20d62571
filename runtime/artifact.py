"""`Artifact`: one compiled model in one file (a zip).

Members:

- ``manifest.json``: format and vtakit versions, the backends used, input/output names, shapes
  and dtypes, thread count, the creator; where an accelerator backend is used, its hardware
  configuration (``hw_config``) and that configuration's hash (``hw_config_hash``); and
  ``members``: every other member's name, size and SHA-256, so that a member that was changed,
  cut short, added or lost is refused by name;
- ``plan.json``: the backend-neutral plan (buffers, steps naming their backend, and each
  backend's section metadata; see `runtime.plan.Plan`);
- ``params.npz``: constants (weights, pre-packed);
- ``<backend>/...``: each backend's own files; the CPU's are ``cpu/module.ll`` (every kernel,
  linked LLVM IR) and ``cpu/<target>.o`` (object code; the section metadata says for which
  triple, CPU and features).

An artifact is validated, never trusted: `Artifact.load` checks the checksums, then the plan
(`Plan.validate`: buffers, arguments, signatures, parameters against the buffers that hold
them), then each backend's section (its runner's ``check_section``, then ``check_plan`` for what
the section says of the plan and the manifest; the accelerator's proves that no stream can
touch device memory outside its slots, docs/vta.md), and raises `ArtifactError`
naming the member or field, what it found and what it expected, before any native code is
loaded. Whatever a corrupt zip, npz or JSON member makes the libraries raise becomes an
`ArtifactError` too.
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .plan import Plan, PlanError
from .runners import runner_class

FORMAT = "vtakit-artifact"
# 3: manifest "members" (size and SHA-256 of every member). Older versions are refused.
FORMAT_VERSION = 3
_TOP_MEMBERS = {"manifest.json", "plan.json", "params.npz"}
MAX_MANIFEST_BYTES = 16 << 20
# What the zip, zlib, numpy and json readers raise on bytes that are not what they expect (a
# member that is not deflate data, a bad header, a truncated file, an unsupported compression
# method or a set encryption flag, a pickle where numbers were expected...).
_CORRUPT = (zipfile.BadZipFile, zlib.error, KeyError, ValueError, TypeError, IndexError,
            OSError, EOFError, NotImplementedError, RuntimeError, OverflowError, struct.error,
            AttributeError, RecursionError)


class ArtifactError(ValueError):
    """A file that is not a vtakit artifact, is corrupt, or has an unsupported version."""


@dataclass
class Artifact:
    """A compiled model.

    Parameters
    ----------
    manifest : dict
        Versions, backends, graph signature, hardware configuration (see the module docstring).
    plan : Plan
        The plan, with one section per backend (the sections' members are the backend files).
    """

    manifest: dict[str, Any]
    plan: Plan
    quantization: Any = None  # the compiler's quantisation report, when it made this artifact

    @property
    def backends(self) -> list[str]:
        return list(self.manifest.get("backends", self.plan.backends))

    def members(self) -> dict[str, bytes]:
        """Every member but the manifest, by name, as `to_bytes` writes them."""
        pbuf = io.BytesIO()
        np.savez(pbuf, **self.plan.params)  # type: ignore[arg-type]
        files = {"plan.json": json.dumps(self.plan.to_json()).encode(),
                 "params.npz": pbuf.getvalue()}
        for backend, section in self.plan.sections.items():
            for member, data in section.members.items():
                files[f"{backend}/{member}"] = data
        return files

    def to_bytes(self) -> bytes:
        """The artifact file: the manifest (with this format's version and every member's size
        and SHA-256), then the members."""
        files = self.members()
        manifest = {**self.manifest, "format": FORMAT, "format_version": FORMAT_VERSION,
                    "members": {n: {"size_bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                                for n, d in files.items()}}
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("manifest.json", json.dumps(manifest, indent=1))
            for name, data in files.items():
                z.writestr(name, data)
        return buf.getvalue()

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.to_bytes())

    @classmethod
    def load(cls, source: str | Path | bytes) -> Artifact:
        """Read an artifact from a path or from its bytes and validate it (see the module
        docstring); `ArtifactError` says what is wrong."""
        what = "<bytes>" if isinstance(source, bytes) else str(source)
        if isinstance(source, bytes):
            data = source
        else:
            try:
                data = Path(source).read_bytes()
            except OSError as e:
                raise ArtifactError(f"{what}: cannot read the artifact ({e.strerror or e})") \
                    from None
        try:
            z = zipfile.ZipFile(io.BytesIO(data))
        except _CORRUPT as e:
            raise ArtifactError(f"{what}: not a vtakit artifact (not a zip file: {_why(e)}; "
                                f"expected the output of 'vtakit compile')") from None
        with z:
            manifest, files = _read_members(z, what)
        try:
            params = _read_params(files["params.npz"])
        except _CORRUPT as e:
            raise ArtifactError(f"{what}: member params.npz is corrupt ({_why(e)})") from None
        try:
            plan_json = json.loads(files["plan.json"])
        except _CORRUPT as e:
            raise ArtifactError(f"{what}: member plan.json is not JSON ({_why(e)})") from None
        members: dict[str, dict[str, bytes]] = {}
        for n in sorted(set(files) - _TOP_MEMBERS):
            backend, _, member = n.partition("/")
            members.setdefault(backend, {})[member] = files[n]
        try:
            plan = Plan.from_json(plan_json, params, members)
        except PlanError as e:
            raise ArtifactError(f"{what}: member plan.json: {e}") from None
        backends = manifest.get("backends")
        if not isinstance(backends, list) or set(backends) != set(plan.sections):
            raise ArtifactError(f"{what}: manifest.json backends: expected the plan's sections "
                                f"{sorted(plan.sections)}, got {backends!r}")
        for key, sig in (("inputs", plan.inputs), ("outputs", plan.outputs)):
            want = [{"name": n, "dtype": d, "shape": list(sh)} for n, d, sh in sig]
            if key in manifest and manifest[key] != want:
                raise ArtifactError(f"{what}: manifest.json {key}: expected the plan's {want}, "
                                    f"got {manifest[key]!r}")
        for name, section in plan.sections.items():
            try:
                runner = runner_class(name)
            except ValueError as e:
                raise ArtifactError(f"{what}: member plan.json section {name!r}: {e}") from None
            try:
                runner.check_section(section)
                runner.check_plan(section, plan, manifest)
            except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
                raise ArtifactError(f"{what}: {name} section: {_why(e)}") from None
        stray = sorted(set(members) - set(plan.sections))
        if stray:
            raise ArtifactError(f"{what}: members under {stray} belong to no section of the "
                                f"plan (its sections: {sorted(plan.sections)})")
        return cls(manifest, plan)


def _why(e: BaseException) -> str:
    """An exception as a phrase: its message, prefixed by its type where that says more."""
    text = str(e) if not isinstance(e, KeyError) else f"no {e}"
    if type(e) in (ValueError, PlanError):
        return text
    return f"{'zlib.error' if isinstance(e, zlib.error) else type(e).__name__}: {text}"


def _read_members(z: zipfile.ZipFile, what: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest and every member it lists, each checked against its size and SHA-256."""
    infos = z.infolist()
    names = [i.filename for i in infos]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ArtifactError(f"{what}: corrupt artifact: member(s) {dup} appear more than once")
    if "manifest.json" not in names:
        raise ArtifactError(f"{what}: not a vtakit artifact (no manifest.json; members: "
                            f"{sorted(names)[:5]})")
    manifest = _read_manifest(z, what)
    listed = manifest["members"]
    missing = sorted(set(listed) - set(names))
    if missing:
        raise ArtifactError(f"{what}: corrupt artifact: member(s) {missing} listed in the "
                            f"manifest are missing")
    extra = sorted(set(names) - set(listed) - {"manifest.json"})
    if extra:
        raise ArtifactError(f"{what}: corrupt artifact: member(s) {extra} are not listed in the "
                            f"manifest")
    files: dict[str, bytes] = {}
    for info in infos:
        name = info.filename
        if name == "manifest.json":
            continue
        want = listed[name]
        if info.file_size != want["size_bytes"]:
            raise ArtifactError(f"{what}: member {name}: {info.file_size} bytes, expected "
                                f"{want['size_bytes']} (the manifest's)")
        try:
            data = z.read(info)
        except _CORRUPT as e:
            raise ArtifactError(f"{what}: member {name} is corrupt ({_why(e)})") from None
        digest = hashlib.sha256(data).hexdigest()
        if len(data) != want["size_bytes"] or digest != want["sha256"]:
            raise ArtifactError(f"{what}: member {name}: SHA-256 {digest[:16]}... of "
                                f"{len(data)} bytes, expected {want['sha256'][:16]}... of "
                                f"{want['size_bytes']} (the manifest's): the member is "
                                f"corrupt")
        files[name] = data
    return manifest, files


def _read_manifest(z: zipfile.ZipFile, what: str) -> dict[str, Any]:
    info = z.getinfo("manifest.json")
    if info.file_size > MAX_MANIFEST_BYTES:
        raise ArtifactError(f"{what}: manifest.json: {info.file_size} bytes, expected at most "
                            f"{MAX_MANIFEST_BYTES}")
    try:
        manifest = json.loads(z.read(info))
    except _CORRUPT as e:
        raise ArtifactError(f"{what}: member manifest.json is corrupt ({_why(e)})") from None
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{what}: manifest.json: expected a JSON object, got "
                            f"{type(manifest).__name__}")
    fmt, version = manifest.get("format"), manifest.get("format_version")
    if fmt != FORMAT:
        raise ArtifactError(f"{what}: manifest.json format: expected {FORMAT!r}, got {fmt!r}")
    if version != FORMAT_VERSION:
        older = isinstance(version, int) and not isinstance(version, bool) \
            and version < FORMAT_VERSION
        why = " (older versions carry no member checksums)" if older else ""
        raise ArtifactError(f"{what}: format version {version!r} is not supported: this vtakit "
                            f"reads version {FORMAT_VERSION}{why}; recompile the model with "
                            f"this vtakit")
    listed = manifest.get("members")
    ok = isinstance(listed, dict) and {"plan.json", "params.npz"} <= set(listed)
    if not ok:
        got = sorted(listed)[:5] if isinstance(listed, dict) else repr(listed)[:60]
        raise ArtifactError(f"{what}: manifest.json members: expected an object listing "
                            f"plan.json, params.npz and every backend member, got {got}")
    assert isinstance(listed, dict)
    for name, entry in listed.items():
        ok = (isinstance(entry, dict) and isinstance(entry.get("size_bytes"), int)
              and not isinstance(entry.get("size_bytes"), bool) and entry["size_bytes"] >= 0
              and isinstance(entry.get("sha256"), str) and len(entry["sha256"]) == 64)
        if not ok:
            raise ArtifactError(f"{what}: manifest.json members[{name!r}]: expected "
                                f'{{"size_bytes": int, "sha256": 64 hex digits}}, got '
                                f"{entry!r:.80}")
        top = name in _TOP_MEMBERS
        backend, _, member = name.partition("/")
        if not top and not (backend.isidentifier() and member and not name.endswith("/")):
            raise ArtifactError(f"{what}: manifest.json members: {name!r} is not a member name "
                                f"(expected plan.json, params.npz or <backend>/<file>)")
    return manifest


def _read_params(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}
