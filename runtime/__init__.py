"""vtakit.runtime: loads compiled artifacts and executes their plans on CPU and accelerator.

Imports nothing from `vtakit.compiler`: a deployed model needs only this package, the driver
(for an accelerator) and llvmlite (for the CPU code).
"""

from .artifact import Artifact, ArtifactError
from .executor import GraphExecutor, StepProfile
from .plan import Buffer, Call, Plan, PlanError, Section, Step
from .runners import HostBuffers, Runner, Segment, available_runners, register_runner, runner_class
from .session import InferenceSession, NodeArg

__all__ = ["Artifact", "ArtifactError", "GraphExecutor", "StepProfile", "InferenceSession",
           "NodeArg", "Plan", "PlanError", "Buffer", "Call", "Step", "Section", "Runner",
           "Segment", "HostBuffers", "register_runner", "runner_class", "available_runners"]
