"""Graph-to-graph optimisation passes (each `Graph -> Graph`, one per module) and the memory
planner, an analysis. `vtakit.compiler.pipeline` lists the passes in the order they run."""

from .eliminate_dead_code import eliminate_dead_code
from .fold_batch_norm import fold_batch_norm
from .fold_constants import fold_constants
from .fold_requant_clamp import fold_requant_clamp
from .fuse_elementwise import fuse_elementwise
from .fuse_epilogues import fuse_epilogues
from .plan_memory import MemoryPlan, plan_memory
from .shift_uint8 import shift_uint8

__all__ = ["eliminate_dead_code", "fold_batch_norm", "fold_constants", "fold_requant_clamp",
           "fuse_elementwise", "fuse_epilogues", "MemoryPlan", "plan_memory", "shift_uint8"]
