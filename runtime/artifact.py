"""`Artifact`: one compiled model in one file (a zip).

Members:

- ``manifest.json``: format and vtakit versions, the backends used, input/output names, shapes
  and dtypes, thread count, the creator; where an accelerator backend is used, its hardware
  configuration (``hw_config``) and that configuration's hash (``hw_config_hash``);
- ``plan.json``: the backend-neutral plan (buffers, steps naming their backend, and each
  backend's section metadata; see `runtime.plan.Plan`);
- ``params.npz``: constants (weights, pre-packed);
- ``<backend>/...``: each backend's own files; the CPU's are ``cpu/module.ll`` (every kernel,
  linked LLVM IR) and ``cpu/<target>.o`` (object code; the section metadata says for which
  triple, CPU and features).
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .plan import Plan, PlanError
from .runners import runner_class

FORMAT = "vtakit-artifact"
FORMAT_VERSION = 2
_TOP_MEMBERS = {"manifest.json", "plan.json", "params.npz"}


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

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("manifest.json", json.dumps(self.manifest, indent=1))
            z.writestr("plan.json", json.dumps(self.plan.to_json()))
            pbuf = io.BytesIO()
            np.savez(pbuf, **self.plan.params)  # type: ignore[arg-type]
            z.writestr("params.npz", pbuf.getvalue())
            for backend, section in self.plan.sections.items():
                for member, data in section.members.items():
                    z.writestr(f"{backend}/{member}", data)
        return buf.getvalue()

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.to_bytes())

    @classmethod
    def load(cls, source: str | Path | bytes) -> Artifact:
        """Read an artifact from a path or from its bytes; `ArtifactError` says what is wrong."""
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
        except zipfile.BadZipFile:
            raise ArtifactError(f"{what}: not a vtakit artifact (not a zip file; expected the "
                                f"output of 'vtakit compile')") from None
        with z:
            names = set(z.namelist())
            if "manifest.json" not in names:
                raise ArtifactError(f"{what}: not a vtakit artifact (no manifest.json; members: "
                                    f"{sorted(names)[:5]})")
            try:
                manifest = json.loads(z.read("manifest.json"))
                fmt, version = manifest.get("format"), manifest.get("format_version")
            except (ValueError, AttributeError, zipfile.BadZipFile) as e:
                raise ArtifactError(f"{what}: corrupt manifest.json ({e})") from None
            if fmt != FORMAT:
                raise ArtifactError(f"{what}: format {fmt!r} is not {FORMAT!r}")
            if version != FORMAT_VERSION:
                raise ArtifactError(f"{what}: format version {version!r} is not supported "
                                    f"(this vtakit reads version {FORMAT_VERSION}); recompile "
                                    f"the model with this vtakit")
            missing = {"plan.json", "params.npz"} - names
            if missing:
                raise ArtifactError(f"{what}: corrupt artifact, missing {sorted(missing)}")
            try:
                plan_json = json.loads(z.read("plan.json"))
                with np.load(io.BytesIO(z.read("params.npz"))) as npz:
                    params = {k: npz[k] for k in npz.files}
                members: dict[str, dict[str, bytes]] = {}
                for n in sorted(names - _TOP_MEMBERS):
                    backend, sep, member = n.partition("/")
                    if sep and member and not n.endswith("/"):
                        members.setdefault(backend, {})[member] = z.read(n)
            except (ValueError, KeyError, TypeError, zipfile.BadZipFile, OSError) as e:
                raise ArtifactError(f"{what}: corrupt artifact ({type(e).__name__}: {e})") \
                    from None
        try:
            plan = Plan.from_json(plan_json, params, members)
        except PlanError as e:
            raise ArtifactError(f"{what}: corrupt plan.json: {e}") from None
        backends = manifest.get("backends")
        if not isinstance(backends, list) or set(backends) != set(plan.sections):
            raise ArtifactError(f"{what}: the manifest's backends {backends!r} do not match the "
                                f"plan's sections {sorted(plan.sections)}")
        for name, section in plan.sections.items():
            try:
                runner = runner_class(name)
            except ValueError as e:
                raise ArtifactError(f"{what}: {e}") from None
            try:
                runner.check_section(section)
            except ValueError as e:
                raise ArtifactError(f"{what}: corrupt artifact: {e}") from None
        return cls(manifest, plan)
