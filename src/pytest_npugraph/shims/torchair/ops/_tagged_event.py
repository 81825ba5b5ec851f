"""Tagged events (``npu_create_tagged_event`` / ``npu_tagged_event_record`` / ``npu_tagged_event_wait``),
``npu_record_tagged_stream`` and the ``air`` ops they trace to.  The ops' kernels run eagerly and in
reduce-overhead graphs (recording/waiting on the current stream); GE mode rejects them."""
from __future__ import annotations

import dataclasses
import threading

import torch
from torch.fx.node import has_side_effect

from torchair.core.utils import logger
from torchair.scope._scope_attr import _npu_get_or_create_stream_with_tag
from ._lib import lib
from ._utils import tagged_events

try:
    import torch_npu  # noqa: F401
except ImportError as e:
    raise RuntimeError("Couldn't import torch_npu. While use tagged_event_record/wait/ api, import torch_npu is "
                       "necessary") from e

_GLOBAL_LOCK = threading.Lock()


def _get_event_by_tag(tag: str, created_inside: bool):
    if not created_inside:
        return tagged_events().get(tag)
    from pytest_npugraph.compiler.events import internal_event

    return internal_event(tag)


def _missing(tag, created_inside, what):
    hint = (f"please make sure you have created tag {tag} with npu_create_tagged_event API." if created_inside
            else "please report an issue to Torchair!")
    return AssertionError(f"tagged event is None while tag is {tag}, tagged event {what} failed, {hint}")


def _event(tag, created_inside, what):
    event = _get_event_by_tag(tag, created_inside)
    if event is None:
        raise _missing(tag, created_inside, what)
    return event


def record_impl(tag: str, created_inside: bool = False):
    logger.debug("tagged event record with tag = [%s]", tag)
    return _event(tag, created_inside, "record").record(torch.npu.current_stream())


def wait_impl(tag: str, created_inside: bool = False):
    logger.debug("tagged event wait with tag = [%s]", tag)
    return _event(tag, created_inside, "wait").wait(torch.npu.current_stream())


def record_tagged_stream_impl(input: torch.Tensor, tagged_stream: str):
    stream = _npu_get_or_create_stream_with_tag(tagged_stream)
    if stream is None:
        raise AssertionError(f"get stream with tag = {tagged_stream} failed")
    _npu_view(input).record_stream(stream)


def _npu_view(t: torch.Tensor) -> torch.Tensor:
    """The NPU tensor behind ``t``: an op on NPU tensors reaches this kernel with their CPU payloads."""
    from pytest_npugraph.runtime import tensor

    block = None if t.is_npu else tensor.block_of_storage(t.untyped_storage().data_ptr())
    return t if block is None else tensor.NpuTensor(t, block.device, block)


def _stream(stream_id, device_index, device_type):
    return torch.npu.Stream(stream_id=int(stream_id), device_index=int(device_index), device_type=int(device_type))


def record_on_stream_impl(event_tag: str, stream_id, device_index, device_type, created_inside: bool = False):
    return _event(event_tag, created_inside, "record on stream").record(_stream(stream_id, device_index, device_type))


def wait_on_stream_impl(event_tag: str, stream_id, device_index, device_type, created_inside: bool = False):
    return _event(event_tag, created_inside, "wait on stream").wait(_stream(stream_id, device_index, device_type))


def stream_wait_stream_impl(stream_id, device_index, device_type, other_stream_id, other_device_index,
                            other_device_type):
    _stream(stream_id, device_index, device_type).wait_stream(_stream(other_stream_id, other_device_index,
                                                                      other_device_type))


def record_tagged_on_stream_impl(input, stream_id, device_index, device_type):
    tensor = _npu_view(input)
    if tensor.is_npu:       # a graph replay re-runs its ops on CPU payloads: record_stream has no device work
        tensor.record_stream(_stream(stream_id, device_index, device_type))


def define_tagged_event_ops(lib, namespace: str, *, tensor_on_stream: bool = False) -> None:
    """The tagged-event ops in ``namespace`` (torchair: ``air``; npugraph_ex: ``npugraph_ex``, which
    also has ``record_tagged_on_stream``: ``tensor_on_stream``)."""
    ops = getattr(torch.ops, namespace)

    def define(schema: str, impl):
        name = schema.split("(")[0]
        if hasattr(ops, name):
            return
        lib.define(schema)
        lib.impl(name, lambda *args, **kwargs: None, "Meta")
        lib.impl(name, impl, "CompositeExplicitAutograd")
        has_side_effect(getattr(ops, name).default)

    def define_inplace(name: str, schema_args: str, functional: str, impl):
        """A ``Tensor(a!)`` variant whose Functionalize kernel lowers to the out-of-place op
        (recording a stream does not change the data)."""
        if hasattr(ops, name):
            return
        lib.define(f"{name}({schema_args}) -> ()")
        lib.impl(name, lambda *args: None, "Meta")
        lib.impl(name, lambda *args: getattr(ops, functional)(*args), "Functionalize")
        lib.impl(name, impl, "CompositeExplicitAutograd")

    define("tagged_event_record(str tag, bool created_inside=False) -> ()", record_impl)
    define("tagged_event_wait(str tag, bool created_inside=False) -> ()", wait_impl)
    define("record_tagged_stream(Tensor input, str tag) -> ()", record_tagged_stream_impl)
    define_inplace("record_tagged_stream_", "Tensor(a!) input, str tag", "record_tagged_stream",
                   record_tagged_stream_impl)
    define("tagged_event_record_on_stream(str event_tag, str stream_id, str device_index, str device_type, "
           "bool created_inside=False) -> ()", record_on_stream_impl)
    define("tagged_event_wait_on_stream(str event_tag, str stream_id, str device_index, str device_type, "
           "bool created_inside=False) -> ()", wait_on_stream_impl)
    define("tagged_stream_wait_stream(str stream_id, str device_index, str device_type, str other_stream_id, "
           "str other_device_index, str other_device_type) -> ()", stream_wait_stream_impl)
    if tensor_on_stream:
        define("record_tagged_on_stream(Tensor input, str stream_id, str device_index, str device_type) -> ()",
               record_tagged_on_stream_impl)
        define_inplace("record_tagged_on_stream_",
                       "Tensor(a!) input, str stream_id, str device_index, str device_type",
                       "record_tagged_on_stream", record_tagged_on_stream_impl)


define_tagged_event_ops(lib, "air")


def _npu_create_tagged_event(tag: str):
    with _GLOBAL_LOCK:
        registry = tagged_events()
        if tag in registry.keys():
            raise ValueError(f"tagged event tag {tag} is already in use")
        event = torch.npu.Event()
        _name_event(event, tag)
        registry[tag] = event
        logger.debug("create tagged event with tag = [%s] successfully", tag)
        return event


def _name_event(event, tag: str) -> None:
    """Name the event by its tag in the trace (reports say "tagged event '66'")."""
    rt, state = event._live()
    state.label = f"tagged event '{tag}'"
    info = rt.trace.events.get(state.eid)
    if info is not None:
        rt.trace.events[state.eid] = dataclasses.replace(info, label=state.label, tag=tag)


def _get_tag_by_event(event) -> str:
    tag = tagged_events().get_reverse(event)
    if tag is None:
        raise ValueError(f"tagged event {event} is not in use")
    return tag


def _npu_tagged_event_record(event):
    return torch.ops.air.tagged_event_record(_get_tag_by_event(event))


def _npu_tagged_event_wait(event):
    return torch.ops.air.tagged_event_wait(_get_tag_by_event(event))


def _npu_record_tagged_stream(input: torch.Tensor, tagged_stream: str):
    return torch.ops.air.record_tagged_stream_(input, tagged_stream)
