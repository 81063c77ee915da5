"""`sparkeos chaos`: a job run under faults in a sandbox of its own, then audited with its own transformation as the
oracle. See docs/chaos.md."""

from .api import ChaosRunFailed, run
from .engine import ChaosSettings, run_chaos
from .faults import KINDS, FaultError, parse_faults
from .report import ChaosReport
from .sandbox import SandboxError

__all__ = ["KINDS", "ChaosReport", "ChaosRunFailed", "ChaosSettings", "FaultError", "SandboxError", "parse_faults",
           "run", "run_chaos"]
