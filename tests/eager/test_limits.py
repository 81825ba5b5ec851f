"""Device and stream core limits against torch_npu 2.14.0 (torch_npu_api.md §1.5, §3)."""
import pytest
import torch
import torch_npu

from pytest_npugraph import trace as T

FULL = {"cube_core_num": 24, "vector_core_num": 48}        # Ascend910B1, the default chip
ONCE = r"^Function 'set_device_limit' has already been called, You can only set this interface once\."


def limits(cube, vector):
    return {"cube_core_num": cube, "vector_core_num": vector}


# ------------------------------------------------------------------ stream limits
@pytest.mark.parametrize("api, extra", [("set_stream_limit", (4, 8)), ("get_stream_limit", ()),
                                        ("reset_stream_limit", ())])
def test_stream_none_is_rejected_first(npugraph, api, extra):
    with pytest.raises(AssertionError) as info:
        getattr(torch.npu, api)(None, *extra)
    assert str(info.value).startswith("stream cannot be None")


@pytest.mark.parametrize("api, extra", [("set_stream_limit", (4, 8)), ("get_stream_limit", ()),
                                        ("reset_stream_limit", ())])
@pytest.mark.parametrize("make, shown", [
    (lambda: 7, "<class 'int'>"),
    (lambda: torch.npu.SyncLaunchStream(), "<class 'torch_npu.npu.streams.SyncLaunchStream'>"),
    (lambda: torch.Stream(stream_id=0, device_index=0, device_type=20), "<class 'torch.Stream'>"),
])
def test_non_npu_streams_are_rejected(npugraph, api, extra, make, shown):
    with pytest.raises(AssertionError) as info:
        getattr(torch.npu, api)(make(), *extra)
    assert str(info.value).startswith(f"stream should be torch_npu.npu.Stream, could not be {shown}")


def test_unset_stream_limit_reports_the_device_limit(npugraph):
    s = torch.npu.Stream()
    assert torch.npu.get_stream_limit(s) == FULL == torch.npu.get_device_limit(0)
    assert torch.npu.get_stream_limit(torch.npu.current_stream()) == FULL


def test_set_stream_limit_minus_one_leaves_a_value_unchanged(npugraph):
    s = torch.npu.Stream()
    assert torch.npu.set_stream_limit(s, 10) is None
    assert torch.npu.get_stream_limit(s) == limits(10, 48)
    torch.npu.set_stream_limit(s, -1, 20)
    assert torch.npu.get_stream_limit(s) == limits(10, 20)
    torch.npu.set_stream_limit(s, vector_num=30)
    assert torch.npu.get_stream_limit(s) == limits(10, 30)
    torch.npu.set_stream_limit(s)
    assert torch.npu.get_stream_limit(s) == limits(10, 30)
    assert torch.npu.get_stream_limit(torch.npu.Stream()) == FULL       # other streams keep theirs


def test_stream_limits_follow_the_stream_not_the_handle(npugraph):
    s = torch.npu.Stream()
    torch.npu.set_stream_limit(s, 6, 12)
    handle = torch_npu.npu.Stream(stream_id=s.stream_id, device_index=0, device_type=20)
    assert torch.npu.get_stream_limit(handle) == limits(6, 12)
    torch.npu.set_stream(s)
    assert torch.npu.get_stream_limit(torch.npu.current_stream()) == limits(6, 12)


def test_upstream_set_stream_res_limit(npugraph):
    """test/npu/test_torch_npu.py::test_set_stream_res_limit (skipped upstream)."""
    dev = torch.npu.current_device()
    torch.npu.set_device_limit(dev, 12, 24)
    s = torch.npu.Stream()
    torch.npu.set_stream_limit(s, 13, 25)
    assert torch.npu.get_stream_limit(s) == limits(13, 25)
    assert torch.npu.reset_stream_limit(s) is None
    assert torch.npu.get_stream_limit(s) == {"cube_core_num": 12, "vector_core_num": 24}


def test_limits_in_force_reach_the_trace(npugraph):
    s = torch.npu.Stream()
    torch.npu.set_stream_limit(s, 8, 16)
    with torch.npu.stream(s):
        torch.ones(4, device="npu")
    kernel = [r for r in npugraph.trace.records if isinstance(r, T.Kernel)][-1]
    assert (kernel.cube_limit, kernel.vector_limit) == (8, 16)
    markers = [type(r) for r in npugraph.trace.records if isinstance(r, T.Marker)]
    assert markers.count(T.StreamLimit) == 2                         # one per value set


# ------------------------------------------------------------------ device limits
def test_set_and_get_device_limit(npugraph):
    assert torch.npu.get_device_limit(0) == FULL
    assert torch.npu.set_device_limit(0, 16) is None                 # vector -1: unchanged
    assert torch.npu.get_device_limit(0) == limits(16, 48)
    assert torch.npu.get_stream_limit(torch.npu.Stream()) == limits(16, 48)


def test_set_device_limit_only_once(npugraph):
    torch.npu.set_device_limit(0, 12, 24)
    with pytest.raises(RuntimeError, match=ONCE):
        torch.npu.set_device_limit(0, 10, 20)
    with pytest.raises(RuntimeError, match=ONCE):
        torch.npu.set_device_limit("anything")                        # any second call
    assert torch.npu.get_device_limit(0) == limits(12, 24)


def test_a_failed_first_call_still_counts(npugraph):
    with pytest.raises(TypeError):
        torch.npu.set_device_limit("0", 12, 24)
    with pytest.raises(RuntimeError, match=ONCE):
        torch.npu.set_device_limit(0, 12, 24)
    assert torch.npu.get_device_limit(0) == FULL


@pytest.mark.parametrize("api", ["set_device_limit", "get_device_limit"])
@pytest.mark.parametrize("bad, name", [(True, "bool"), ("npu:0", "str"), (0.0, "float"),
                                       (torch.device("npu:0"), "device"), (None, "NoneType")])
def test_device_must_be_an_int(npugraph, api, bad, name):
    with pytest.raises(TypeError) as info:
        getattr(torch.npu, api)(bad)
    assert str(info.value).startswith(f"device must be an int, but got {name}")


@pytest.mark.parametrize("api", ["set_device_limit", "get_device_limit"])
@pytest.mark.parametrize("bad", [-1, 1, 8])
def test_device_id_out_of_range(npugraph, api, bad):
    with pytest.raises(AssertionError, match="^Invalid device id"):
        getattr(torch.npu, api)(bad)


@pytest.mark.npu_devices(2)
def test_uninitialised_device_has_no_limits(npugraph):
    with pytest.raises(RuntimeError, match="^NPU device 1 has not been initialized! Can not get device resource "
                                           "limit"):
        torch.npu.get_device_limit(1)
    torch.ones(1, device="npu:1")                                     # using a device activates it
    assert torch.npu.get_device_limit(1) == FULL


@pytest.mark.npu_devices(2)
def test_set_limit_of_an_uninitialised_device_fails(npugraph):
    with pytest.raises(RuntimeError, match="^NPU device 1 has not been initialized!"):
        torch.npu.set_device_limit(1, 8, 16)
    with torch.npu.device(1):
        assert torch.npu.get_device_limit(1) == FULL                   # activated now; never limited


@pytest.mark.npu_devices(2)
def test_device_limits_are_per_device(npugraph):
    torch.npu.init()                                                  # activates device 0
    torch.npu.set_device(1)
    torch.npu.set_device_limit(1, 4, 8)
    assert torch.npu.get_device_limit(1) == limits(4, 8)
    assert torch.npu.get_device_limit(0) == FULL
    assert torch.npu.get_stream_limit(torch.npu.Stream(device=1)) == limits(4, 8)
    assert torch.npu.get_stream_limit(torch.npu.Stream(device=0)) == FULL


@pytest.mark.parametrize("run", range(2))
def test_limits_are_fresh_in_each_test(npugraph, run):
    assert torch.npu.get_device_limit(0) == FULL                      # nothing left by another test
    assert torch.npu.get_stream_limit(torch.npu.Stream()) == FULL
    torch.npu.set_device_limit(0, 3 + run, 6)                         # allowed once in every test
    torch.npu.set_stream_limit(torch.npu.Stream(), 2, 2)
    assert torch.npu.get_device_limit(0) == limits(3 + run, 6)


@pytest.mark.npu_chip("Ascend910B3")
def test_full_limit_follows_the_chip(npugraph):
    assert torch.npu.get_device_limit(0) == limits(20, 40)
    assert torch.npu.get_stream_limit(torch.npu.Stream()) == limits(20, 40)
