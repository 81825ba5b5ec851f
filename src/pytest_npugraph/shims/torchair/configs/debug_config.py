"""``CompilerConfig.debug``: graph/data dumps, ``run_eagerly``, ``deadlock_check`` and the aclgraph
switches (memory-reuse modes, cloning, reinplace passes, the capture limit)."""
from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Optional

from torchair.configs._option_base import IntRangeValue, NpuBaseConfig, OptionValue

__all__ = []
INT64_MAX = 2**63 - 1


class _DebugBase(NpuBaseConfig):
    def __init__(self):
        self._path = OptionValue(None, None)
        super().__init__()

    @property
    def enabled(self):
        return self.type.value is not None  # pylint: disable=no-member

    def full_path(self, name: str, *, with_timestap=True):
        if not self.enabled:
            return None
        import torch.distributed as dist

        path = "." if self._path.value is None else self._path.value
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        stamp = f"_ts_{datetime.now(tz=timezone.utc).strftime('%Y%m%d%H%M%S%f')}" if with_timestap else ""
        return f"{path}/{name}_rank_{rank}_pid_{os.getpid()}{stamp}.{self.type.value}"  # pylint: disable=no-member


class _PathDebug(_DebugBase):
    """A dump with a ``path`` (stored resolved)."""

    @property
    def path(self):
        return self._path.value

    @path.setter
    def path(self, value):
        self._path.value = os.path.realpath(value)


class _Dump(_PathDebug):
    def __init__(self):
        self.type = OptionValue(None, ["txt", "pbtxt", "py"])
        super().__init__()
        self._fixed_attrs.append("path")


class _DataDump(_PathDebug):
    def __init__(self):
        self.filter = None
        self.type = OptionValue(None, ["npy"])
        super().__init__()
        self._fixed_attrs.append("filter")
        self._fixed_attrs.append("path")


class _FxSummary(_DebugBase):
    def __init__(self):
        self.type = OptionValue(None, ["csv"])
        self.skip_compile = OptionValue(True, [True, False])
        super().__init__()


class _AclGraphDebugConfig(NpuBaseConfig):
    """Config for aclgraph debug option"""

    def __init__(self) -> None:
        self.disable_reinplace_inplaceable_ops_pass = OptionValue(False, [True, False])
        self.disable_reinplace_input_mutated_ops_pass = OptionValue(False, [True, False])
        self.disable_mempool_reuse_in_same_fx = OptionValue(False, [True, False])
        self.enable_output_clone = OptionValue(False, [True, False])
        self.static_capture_size_limit = IntRangeValue(64, 1, INT64_MAX)
        self.clone_input = OptionValue(True, [True, False])
        self.remove_cat_ops = OptionValue(True, [True, False])
        super().__init__()

    def as_dict(self, mode: Optional[str] = "max-autotune"):
        return {name: getattr(self, name).value for name in (
            "disable_mempool_reuse_in_same_fx", "enable_output_clone", "static_capture_size_limit", "clone_input")}


class _DebugConfig(NpuBaseConfig):
    def __init__(self):
        self.graph_dump = _Dump()
        self.data_dump = _DataDump()
        self.fx_summary = _FxSummary()
        self.run_eagerly = OptionValue(False, [True, False])
        self.aclgraph = _AclGraphDebugConfig()
        self.deadlock_check = OptionValue(False, [True, False])
        super().__init__()

    def as_dict(self, mode: Optional[str] = "max-autotune"):
        local = self.aclgraph.as_dict(mode)
        local["run_eagerly"] = self.run_eagerly.value
        local["deadlock_check"] = self.deadlock_check.value
        return local, {}
