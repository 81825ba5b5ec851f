"""torchair.scope and torchair.ops outside compiled graphs (torchair_api.md §1.1-1.2, §1.5, §2): the
ops and schemas Dynamo keeps in graphs, eager no-ops, tagged events, and their errors."""
import threading

import pytest
import torch
import torch_npu  # noqa: F401
import torchair
from torchair import scope
from torchair.scope import _scope_attr

from pytest_npugraph import trace as T

from .helpers import kernels, records


def test_scope_ops_have_torchairs_schemas_and_side_effects():
    from torch.fx.node import _side_effectful_functions

    import torchair.ops._tagged_event  # noqa: F401  (registered lazily, as in torchair)

    assert str(torch.ops.air.scope_enter.default._schema) == \
        "air::scope_enter(str[] keys, str[] values, bool need_execute=False) -> NoneType"
    assert str(torch.ops.air.scope_exit.default._schema) == "air::scope_exit(bool need_execute=False) -> NoneType"
    assert str(torch.ops.air.wait_tensor.default._schema) == "air::wait_tensor(Tensor self, Tensor dependency) -> Tensor"
    assert str(torch.ops.air.tagged_event_record.default._schema) == \
        "air::tagged_event_record(str tag, bool created_inside=False) -> ()"
    assert str(torch.ops.air.record_tagged_stream_.default._schema) == \
        "air::record_tagged_stream_(Tensor(a!) input, str tag) -> ()"
    for op in (torch.ops.air.scope_enter, torch.ops.air.scope_exit, torch.ops.air.tagged_event_record,
               torch.ops.air.tagged_event_wait, torch.ops.air.record_tagged_stream, torch.ops.air.wait):
        assert op.default in _side_effectful_functions


def test_scope_attributes_are_strings_in_torchairs_order():
    assert scope.npu_stream_switch("1", 2, False).attrs == [
        ("_user_stream_label", "1"), ("_user_stream_priority", "2"), ("_enable_inner_parallel", "False")]
    assert scope.limit_core_num(4, "8").attrs == [("_op_aicore_num", "4"), ("_op_vectorcore_num", "8")]
    assert scope.super_kernel(None).attrs == [("_super_kernel_scope", ""), ("_super_kernel_options", "")]
    assert scope.op_never_timeout().attrs == [("_op_exec_never_timeout", "True")]
    assert scope.data_dump().attrs == [("torchair_enable_data_dump", "True")]


def test_scopes_do_nothing_in_eager_code(npugraph):
    x = torch.ones(4, device="npu")
    with scope.npu_stream_switch("1"), scope.limit_core_num(2, 4), scope.super_kernel("sk"):
        y = x + 1
    (k,) = kernels(npugraph, "aten::add")
    assert npugraph.trace.streams[k.stream].label == "npu:0/default"   # no stream switch
    assert (k.cube_limit, k.vector_limit) == (0, 0)      # no limit
    assert not _scope_attr.has_scope_attr()
    assert y.cpu().tolist() == [2.0] * 4


def test_executed_scope_ops_push_and_pop_a_thread_local_stack():
    torch.ops.air.scope_enter(["_user_stream_label"], ["7"], need_execute=True)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(_scope_attr.has_scope_attr()))
    worker.start()
    worker.join()
    assert _scope_attr.local.scope_attr.top() == {"_user_stream_label": "7"} and seen == [False]
    torch.ops.air.scope_exit(need_execute=True)
    torch.ops.air.scope_exit(need_execute=True)            # on an empty stack: ignored
    assert not _scope_attr.has_scope_attr()


def test_bad_scope_arguments_raise_as_torchair():
    with pytest.raises(TypeError, match=r"^op_never_timeout\(\) argument 'enable' must be bool, but got int\.$"):
        scope.op_never_timeout(1)
    with pytest.raises(ValueError, match="deterministic level must be 0, 1, 2, or 3, got 5"):
        scope.deterministic(5)
    with pytest.raises(RuntimeError, match=r"Expected a value of type 'List\[str\]' for argument 'values'"):
        with scope.npu_stream_switch(1):      # a tag must be a str
            pass


def test_npu_wait_tensor_is_unusable_eagerly(npugraph):
    x = torch.ones(2, device="npu")
    with pytest.raises(NotImplementedError, match=r"^torch\.ops\.air\.wait_tensor kernel_impl is not implemented! "
                                                  r"npu_wait_tensor is not support in this mode\.$"):
        scope.npu_wait_tensor(x, x)
    assert not kernels(npugraph, "wait_tensor")


def test_tagged_events_work_eagerly_and_are_named_by_tag(npugraph):
    # ST test_eager_with_multi_stream_event
    event = torchair.ops.npu_create_tagged_event(tag="e1")
    x = torch.ones(4, device="npu")
    torchair.ops.npu_tagged_event_record(event)
    with torch.npu.stream(torch.npu.Stream()):
        torchair.ops.npu_tagged_event_wait(event)
        (x * 2).cpu()
    (rec,) = records(npugraph, T.EventRecord)
    (wait,) = records(npugraph, T.EventWait)
    assert rec.event == wait.event
    info = npugraph.trace.events[rec.event]
    assert info.tag == "e1" and info.label == "tagged event 'e1'"
    assert npugraph.trace.streams[rec.stream].label == "npu:0/default"
    assert npugraph.trace.streams[wait.stream].label != "npu:0/default"
    npugraph.assert_clean("race", "event-misuse")


def test_tagged_event_errors(npugraph):
    torchair.ops.npu_create_tagged_event(tag="dup")
    with pytest.raises(ValueError, match="^tagged event tag dup is already in use$"):
        torchair.ops.npu_create_tagged_event(tag="dup")
    stranger = torch.npu.Event()
    with pytest.raises(ValueError, match=r"^tagged event .* is not in use$"):
        torchair.ops.npu_tagged_event_record(stranger)
    with pytest.raises(AssertionError, match=r"tagged event is None while tag is nope, tagged event wait failed, "
                                             r"please report an issue to Torchair!"):
        torch.ops.air.tagged_event_wait("nope")
    with pytest.raises(AssertionError, match=r"tagged event record failed, please make sure you have created tag "
                                             r"inside with npu_create_tagged_event API\."):
        torch.ops.air.tagged_event_record("inside", True)


def test_tags_are_fresh_in_every_test(npugraph):
    torchair.ops.npu_create_tagged_event(tag="dup")     # the previous test used "dup" too


def test_record_tagged_stream_records_the_tensors_use_on_the_tags_stream(npugraph):
    x = torch.ones(4, device="npu")
    torchair.ops.npu_record_tagged_stream(x, "side")
    (use,) = records(npugraph, T.RecordStream)
    assert use.block == x._block.bid and npugraph.trace.streams[use.stream].label.startswith("npu:0/stream-")
    assert not kernels(npugraph, "record_tagged_stream")     # a host-side action, not a device task


def test_ops_wait_and_record(npugraph):
    with pytest.raises(ValueError, match=r"^torchair\.ops\.wait\(\) requires at least one tensor input$"):
        torchair.ops.wait([])
    with pytest.raises(ValueError, match=r"^arguments of torchair\.ops\.wait\(\) must be torch\.Tensor$"):
        torchair.ops.wait([1])
    r = torchair.ops.record()
    assert r.numel() == 0
    torchair.ops.wait([r])
    assert not kernels(npugraph)
