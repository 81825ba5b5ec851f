"""What the plugin tells the emulated runtime about the running test, without importing torch.

The plugin fills this in at test setup; the runtime (imported only when user code imports
``torch_npu``) reads it to build fresh per-test state.  A new ``generation`` means "start over".
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Optional

from . import cann as _cann
from .chips import DEFAULT_CHIP, ChipProfile, lookup


@dataclass(frozen=True)
class TestConfig:
    chip: ChipProfile = field(default_factory=lambda: lookup(DEFAULT_CHIP))
    device_count: int = 1
    allow: frozenset = frozenset()
    nodeid: str = ""
    schedule: str = "program"     # --npu-schedule: program (issue order) or shuffle (runtime/executor.py)
    schedule_seed: int = 0        # --npu-schedule-seed: the shuffle's seed (each test starts from it)
    cann: str = _cann.DEFAULT     # --npu-cann / npu_cann marker: the CANN release emulated (cann.py)
    rank_skew: Optional[int] = None   # seed of the run_ranks threads' skews (runtime/skew.py); None: none


@dataclass
class Context:
    config: TestConfig = field(default_factory=TestConfig)
    generation: int = 0
    hook: Any = None           # pytest's hook relay, for pytest_npugraph_* hooks; None outside pytest
    test_hook: Any = None      # the running test's hook proxy: only the conftest.py files above it answer
    rootdir: Optional[str] = None
    emulating: bool = False
    child: bool = False        # a process a test started (inherit.py): its ranks may be processes

    def begin(self, config: TestConfig, test_hook: Any = None) -> None:
        self.config = config
        self.test_hook = test_hook
        self.generation += 1
        set_torch_version_cann(config.cann)

    def op_profile_answered(self) -> bool:
        """Whether a conftest or plugin of the running test implements ``pytest_npugraph_op_profile``."""
        hook = self.test_hook or self.hook
        if hook is None:
            return False
        impls = getattr(hook.pytest_npugraph_op_profile, "get_hookimpls", None)
        return impls is None or bool(impls())

    def op_profile(self, op_name: str):
        """The users' ``pytest_npugraph_op_profile`` answer for ``op_name`` (conftests of the running test)."""
        hook = self.test_hook or self.hook
        if hook is None:
            return None
        caller = hook.pytest_npugraph_op_profile
        impls = getattr(caller, "get_hookimpls", None)     # pluggy's caller (a child's stand-in has none)
        if impls is not None and not impls():
            return None                 # no conftest or plugin implements it: no call (asked per op and test)
        return caller(op_name=op_name)


CONTEXT = Context()


def set_torch_version_cann(release: str) -> None:
    """``torch.version.cann``: importing the real torch_npu sets it to the installed CANN's version
    (vLLM-Ascend's ``find_hccl_library`` reads it); here the emulated release, once torch_npu is imported."""
    torch = sys.modules.get("torch")
    if torch is not None and "torch_npu" in sys.modules:
        torch.version.cann = release
