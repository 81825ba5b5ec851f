"""The ``npugraph_ex::`` tagged-event ops (mirrors ``ops/_tagged_event.py``): what
``replace_stream_event_pass`` and the event closure put into a graph.  Their kernels record and wait
on the current stream or on the stream named by (id, device index, device type); the events are the
ones the compiler registered under the tag (``created_inside=True``)."""
from __future__ import annotations

import torch
from torch.fx.node import has_side_effect

from npugraph_ex.core.utils import logger
from ._lib import lib

try:
    import torch_npu  # noqa: F401
except ImportError as e:
    raise RuntimeError("Couldn't import torch_npu. While use tagged_event_record/wait/ api, import torch_npu is "
                       "necessary") from e


def _event(tag: str, created_inside: bool, what: str):
    from pytest_npugraph.compiler.events import internal_event

    event = internal_event(tag) if created_inside else None
    if event is None:
        hint = (f"please make sure you have created tag {tag} with npu_create_tagged_event API." if created_inside
                else "please report an issue to Torchair!")
        raise AssertionError(f"tagged event is None while tag is {tag}, tagged event {what} failed, {hint}")
    return event


def _stream(stream_id, device_index, device_type):
    return torch.npu.Stream(stream_id=int(stream_id), device_index=int(device_index), device_type=int(device_type))


def _npu_view(t: torch.Tensor) -> torch.Tensor:
    """The NPU tensor behind ``t``: an op on NPU tensors reaches this kernel with their CPU payloads."""
    from pytest_npugraph.runtime import tensor

    block = None if t.is_npu else tensor.block_of_storage(t.untyped_storage().data_ptr())
    return t if block is None else tensor.NpuTensor(t, block.device, block)


def record_impl(tag: str, created_inside: bool = False):
    logger.debug("tagged event record with tag = [%s]", tag)
    _event(tag, created_inside, "record").record(torch.npu.current_stream())


def wait_impl(tag: str, created_inside: bool = False):
    logger.debug("tagged event wait with tag = [%s]", tag)
    _event(tag, created_inside, "wait").wait(torch.npu.current_stream())


def record_on_stream_impl(event_tag, stream_id, device_index, device_type, created_inside=False):
    _event(event_tag, created_inside, "record on stream").record(_stream(stream_id, device_index, device_type))


def wait_on_stream_impl(event_tag, stream_id, device_index, device_type, created_inside=False):
    _event(event_tag, created_inside, "wait on stream").wait(_stream(stream_id, device_index, device_type))


def stream_wait_stream_impl(stream_id, device_index, device_type, other_stream_id, other_device_index,
                            other_device_type):
    _stream(stream_id, device_index, device_type).wait_stream(
        _stream(other_stream_id, other_device_index, other_device_type))


def record_tagged_on_stream_impl(input, stream_id, device_index, device_type):
    tensor = _npu_view(input)
    if tensor.is_npu:       # a graph replay re-runs its ops on CPU payloads: record_stream has no device work
        tensor.record_stream(_stream(stream_id, device_index, device_type))


def record_tagged_stream_impl(input, tagged_stream: str):
    raise AssertionError(f"get stream with tag = {tagged_stream} failed")


def _define(schema: str, impl):
    name = schema.split("(")[0]
    if hasattr(torch.ops.npugraph_ex, name):
        return
    lib.define(schema)
    lib.impl(name, lambda *args, **kwargs: None, "Meta")
    lib.impl(name, impl, "CompositeExplicitAutograd")
    has_side_effect(getattr(torch.ops.npugraph_ex, name).default)


def _define_inplace(name: str, schema_args: str, functional: str, impl):
    """A ``Tensor(a!)`` variant whose Functionalize kernel lowers to the out-of-place op (recording a
    stream does not change the data)."""
    if hasattr(torch.ops.npugraph_ex, name):
        return
    lib.define(f"{name}({schema_args}) -> ()")
    lib.impl(name, lambda *args: None, "Meta")
    lib.impl(name, lambda *args: getattr(torch.ops.npugraph_ex, functional)(*args), "Functionalize")
    lib.impl(name, impl, "CompositeExplicitAutograd")


_define("tagged_event_record(str tag, bool created_inside=False) -> ()", record_impl)
_define("tagged_event_wait(str tag, bool created_inside=False) -> ()", wait_impl)
_define("tagged_event_record_on_stream(str event_tag, str stream_id, str device_index, str device_type, "
        "bool created_inside=False) -> ()", record_on_stream_impl)
_define("tagged_event_wait_on_stream(str event_tag, str stream_id, str device_index, str device_type, "
        "bool created_inside=False) -> ()", wait_on_stream_impl)
_define("tagged_stream_wait_stream(str stream_id, str device_index, str device_type, str other_stream_id, "
        "str other_device_index, str other_device_type) -> ()", stream_wait_stream_impl)
_define("record_tagged_stream(Tensor input, str tag) -> ()", record_tagged_stream_impl)
_define_inplace("record_tagged_stream_", "Tensor(a!) input, str tag", "record_tagged_stream",
                record_tagged_stream_impl)
_define("record_tagged_on_stream(Tensor input, str stream_id, str device_index, str device_type) -> ()",
        record_tagged_on_stream_impl)
_define_inplace("record_tagged_on_stream_", "Tensor(a!) input, str stream_id, str device_index, str device_type",
                "record_tagged_on_stream", record_tagged_on_stream_impl)
