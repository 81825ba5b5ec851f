"""``npugraph_ex.scope`` (``torch.npu.npugraph_ex.scope``): ``limit_core_num`` and ``deterministic``.
Eagerly they set the stream's limits (level) at once and restore them on exit; inside a compiled
region they become ``npugraph_ex::scope_enter``/``scope_exit`` nodes."""
import torch

from ._scope import _Scope, _npu_core_limit_scope_enter, _npu_scope_enter, _npu_scope_exit

__all__ = ["limit_core_num", "deterministic"]


class _CoreLimitScope:
    def __init__(self, attrs, stream=None):
        self.attrs = attrs
        self.stream = stream

    def __enter__(self):
        if self.stream is None:
            return _npu_scope_enter(self.attrs)
        return _npu_core_limit_scope_enter(self.stream, self.attrs)

    def __exit__(self, *args):
        return _npu_scope_exit()


class _EagerLimitCore:
    def __init__(self, cube_num: int, vector_num: int, stream=None):
        self.cube_num = cube_num
        self.vector_num = vector_num
        self.stream = stream
        self.current_stream = None
        self.origin_cube_num = -1
        self.origin_vector_num = -1

    def __enter__(self):
        self.current_stream = self.stream if self.stream is not None else torch.npu.current_stream()
        origin = torch.npu.get_stream_limit(self.current_stream)
        self.origin_cube_num = origin["cube_core_num"]
        self.origin_vector_num = origin["vector_core_num"]
        torch.npu.set_stream_limit(self.current_stream, self.cube_num, self.vector_num)
        return self

    def __exit__(self, *args):
        torch.npu.set_stream_limit(self.current_stream, self.origin_cube_num, self.origin_vector_num)


class _EagerDeterministic:
    def __init__(self, level: int):
        self.level = level

    def __enter__(self):
        return self

    def __exit__(self, *args):
        return None


def limit_core_num(op_aicore_num: int, op_vectorcore_num: int, stream=None):
    if not torch.compiler.is_compiling():
        return _EagerLimitCore(op_aicore_num, op_vectorcore_num, stream)
    return _CoreLimitScope([("_op_aicore_num", str(op_aicore_num)), ("_op_vectorcore_num", str(op_vectorcore_num))],
                           stream)


def deterministic(level: int):
    """Set the deterministic level for operations in this scope (no effect on the emulated results)."""
    if level not in (0, 1, 2, 3):
        raise ValueError(f"deterministic level must be 0, 1, 2, or 3, got {level}")
    if not torch.compiler.is_compiling():
        return _EagerDeterministic(level)
    return _Scope([("_op_deterministic_level", str(level))], "npugraph_ex")
