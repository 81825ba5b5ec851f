"""``torch.npu.NpuGraphOpHandler`` / ``register_npu_graph_handler``: per-op hooks of torch_npu's
auto-dispatch graph capture (which argument slots ``NPUGraph.update`` may replace, and how).

The base class's hooks behave as torch_npu's (``prepare_capture`` and ``postprocess_result`` pass
through, ``update_args`` walks ``UPDATE_SPECS``); handlers are kept in the registry torch_npu keeps.
The emulated ``NPUGraph.update`` replays with its own table of updatable ops (the ops' specs) and
does not consult registered handlers yet.
"""
from copy import deepcopy

import torch

__all__ = ["NpuGraphOpHandler", "register_npu_graph_handler"]


class NpuGraphOpHandler:
    """Base class of an op's capture/update hooks; stateless (class methods), ``UPDATE_SPECS`` maps an op
    name to ``[("arg", index, key) | ("kwarg", name, key), ...]``."""

    UPDATE_SPECS = {}

    @classmethod
    def prepare_capture(cls, func, args, kwargs):
        return func, args, kwargs

    @classmethod
    def postprocess_result(cls, result, kwargs):
        return result

    @classmethod
    def get_update_specs(cls, op_name):
        return cls.UPDATE_SPECS.get(op_name, [])

    @classmethod
    def update_args(cls, dispatch_record, update_input):
        for loc, idx_or_name, key in cls.get_update_specs(dispatch_record.op_cache_entry.__name__):
            if key not in update_input:
                continue
            if loc == "arg":
                if len(dispatch_record.args) > idx_or_name:
                    dispatch_record.args[idx_or_name] = update_input[key]
            elif loc == "kwarg":
                dispatch_record.kwargs[idx_or_name] = update_input[key]

    @classmethod
    def record_wrap_kwarg(cls, key, value, tensor_param_names):
        if value is None:
            return None

        def npu(t):
            return torch.is_tensor(t) and t.device.type == "npu"
        if isinstance(value, (list, tuple)):
            return type(value)(t if npu(t) else deepcopy(t) for t in value)
        if key in tensor_param_names and npu(value):
            return value
        return deepcopy(value)


_NPU_GRAPH_OP_HANDLERS = {}


def register_npu_graph_handler(op_names):
    """Class decorator: ``@register_npu_graph_handler(["my_op", "my_op.default"])``."""
    if isinstance(op_names, str):
        op_names = [op_names]

    def decorator(cls):
        if not (isinstance(cls, type) and issubclass(cls, NpuGraphOpHandler)):
            raise TypeError(f"{cls!r} must be a subclass of NpuGraphOpHandler")
        for name in op_names:
            _NPU_GRAPH_OP_HANDLERS[name] = cls
        return cls
    return decorator
