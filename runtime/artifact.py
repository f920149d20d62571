"""`Artifact`: one compiled model in one file (a zip).

Members:

- ``manifest.json``: format and vtakit versions, targets, input/output names, shapes and
  dtypes, thread count, the creator, and the host CPU name and features the object code was
  built for;
- ``plan.json``: the lowered program (buffers, steps and calls; see `CpuProgram`);
- ``params.npz``: constants (weights, pre-packed);
- ``cpu/<target>.o``: object code per target (``host`` for this machine, ``aarch64``);
- ``cpu/module.ll``: the linked LLVM IR, JIT-compiled where the object code does not fit.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vtakit.compiler.backend.cpu.program import CpuProgram

FORMAT = "vtakit-artifact"
FORMAT_VERSION = 1


class ArtifactError(ValueError):
    """A file that is not a vtakit artifact, is corrupt, or has an unsupported version."""


@dataclass
class Artifact:
    """A compiled model.

    Parameters
    ----------
    manifest : dict
        Versions, targets, graph signature and build host (see the module docstring).
    program : CpuProgram
        The lowered program (its kernels are only known by index here).
    ir_text : str
        The linked LLVM IR of all kernels.
    objects : dict of str to bytes
        Object code by target name (``"host"``, ``"aarch64"``).
    """

    manifest: dict[str, Any]
    program: CpuProgram
    ir_text: str
    objects: dict[str, bytes] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("manifest.json", json.dumps(self.manifest, indent=1))
            z.writestr("plan.json", json.dumps(self.program.plan_json()))
            pbuf = io.BytesIO()
            np.savez(pbuf, **self.program.params)
            z.writestr("params.npz", pbuf.getvalue())
            z.writestr("cpu/module.ll", self.ir_text)
            for target, obj in self.objects.items():
                z.writestr(f"cpu/{target}.o", obj)
        return buf.getvalue()

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.to_bytes())

    @classmethod
    def load(cls, source: str | Path | bytes) -> Artifact:
        """Read an artifact from a path or from its bytes; `ArtifactError` says what is wrong."""
        what = "<bytes>" if isinstance(source, bytes) else str(source)
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
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
            missing = {"plan.json", "params.npz", "cpu/module.ll"} - names
            if missing:
                raise ArtifactError(f"{what}: corrupt artifact, missing {sorted(missing)}")
            try:
                plan = json.loads(z.read("plan.json"))
                with np.load(io.BytesIO(z.read("params.npz"))) as npz:
                    params = {k: npz[k] for k in npz.files}
                ir_text = z.read("cpu/module.ll").decode()
                objects = {n[4:-2]: z.read(n) for n in names
                           if n.startswith("cpu/") and n.endswith(".o")}
                program = CpuProgram.from_plan_json(plan, params)
            except (ValueError, KeyError, TypeError, zipfile.BadZipFile, OSError) as e:
                raise ArtifactError(f"{what}: corrupt artifact ({type(e).__name__}: {e})") \
                    from None
        return cls(manifest, program, ir_text, objects)

    def load_code(self) -> Any:
        """The machine code for this process: the host object when it was built for this
        CPU, else the IR compiled now."""
        from vtakit.compiler.backend.cpu import jit
        from vtakit.compiler.backend.cpu.codegen_link import LoadedCode

        cpu, features = jit.host_cpu()
        built = self.manifest.get("host", {})
        if ("host" in self.objects and built.get("cpu") == cpu
                and built.get("features") == features):
            try:
                return LoadedCode(obj=self.objects["host"])
            except RuntimeError:
                pass  # fall back to the IR below; the object may not link here
        return LoadedCode(ir_text=self.ir_text)
