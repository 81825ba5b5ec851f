"""Device API of the emulated torch.npu against torch_npu 2.14.0 (torch_npu_api.md §1)."""
import re
import threading
import warnings

import pytest
import torch
import torch_npu

from pytest_npugraph import trace as T

ACL_ERROR = r"error code is \d+"


def test_device_count_and_availability(npugraph):
    assert torch.npu.device_count() == 1 == npugraph.device_count
    assert torch.npu.is_available() is True
    assert torch_npu.npu is torch.npu


@pytest.mark.npu_devices(2)
def test_npu_devices_marker_sets_the_count(npugraph):
    assert torch.npu.device_count() == 2 == npugraph.device_count
    assert torch.ones(1, device="npu:1").device == torch.device("npu", 1)


@pytest.mark.npu_devices(2)
@pytest.mark.parametrize("spelling", [1, "npu:1", torch.device("npu", 1)])
def test_set_device_spellings(npugraph, spelling):
    assert torch.npu.current_device() == 0
    torch.npu.set_device(spelling)
    assert torch.npu.current_device() == 1
    assert torch.ones(2, device="npu").device.index == 1   # "npu" now means the current device


@pytest.mark.npu_devices(2)
def test_set_device_negative_is_a_no_op(npugraph):
    torch.npu.set_device(1)
    torch.npu.set_device(-1)
    assert torch.npu.current_device() == 1


@pytest.mark.parametrize("device, shown", [("cpu", "cpu"), (torch.device("cuda", 0), "cuda:0")])
def test_set_device_rejects_other_device_types(npugraph, device, shown):
    with pytest.raises(ValueError) as info:
        torch.npu.set_device(device)
    assert str(info.value).startswith(f"Expected a npu device, but got: {shown}")
    assert torch.npu.current_device() == 0


@pytest.mark.parametrize("index", [1, "npu:3"])
def test_set_device_out_of_range_fails_in_acl(npugraph, index):
    with pytest.raises(RuntimeError, match=ACL_ERROR):
        torch.npu.set_device(index)
    assert torch.npu.current_device() == 0


def test_synchronize_returns_none_and_is_a_device_sync(npugraph):
    torch.ones(3, device="npu")
    assert torch.npu.synchronize() is None
    last = npugraph.trace.records[-1]
    assert isinstance(last, T.HostSync) and last.what == "device" and last.device == 0


@pytest.mark.npu_devices(2)
@pytest.mark.parametrize("which", [1, "npu:1", torch.device("npu:1")])
def test_synchronize_other_device_keeps_the_current_one(npugraph, which):
    torch.npu.synchronize(which)
    last = npugraph.trace.records[-1]
    assert isinstance(last, T.HostSync) and (last.what, last.device) == ("device", 1)
    assert torch.npu.current_device() == 0


@pytest.mark.npu_chip("Ascend910B3")
def test_get_device_name(npugraph):
    assert torch.npu.get_device_name() == "Ascend910B3"
    assert torch.npu.get_device_name(0) == torch.npu.get_device_name("npu:0") == "Ascend910B3"


@pytest.mark.parametrize("api", ["get_device_name", "get_device_properties", "utilization", "mem_get_info"])
@pytest.mark.parametrize("bad", [1, -1, "npu:7"])
def test_invalid_device_id_is_an_assertion_error(npugraph, api, bad):
    with pytest.raises(AssertionError) as info:
        getattr(torch.npu, api)(bad)
    assert str(info.value).startswith("Invalid device id")


def test_get_device_name_rejects_a_cpu_device(npugraph):
    with pytest.raises(ValueError, match="^Expected a npu device, but got: cpu"):
        torch.npu.get_device_name("cpu")


def test_can_device_access_peer_checks_both_ids(npugraph):
    with pytest.raises(AssertionError, match="^Invalid device id"):
        torch.npu.can_device_access_peer(3, 0)
    with pytest.raises(AssertionError, match="^Invalid peer device id"):
        torch.npu.can_device_access_peer(0, 3)


@pytest.mark.npu_chip("Ascend910B3")
def test_device_properties_fields(npugraph):
    p = torch.npu.get_device_properties(0)
    assert p.name == "Ascend910B3"
    assert p.total_memory == 64 * 2**30
    assert (p.cube_core_num, p.vector_core_num) == (20, 40)
    assert p.multi_processor_count == 40
    assert p.L2_cache_size > 0
    for none_field in ("major", "minor", "is_multi_gpu_board", "is_integrated", "max_threads_per_multi_processor",
                       "warp_size", "regs_per_multiprocessor", "gcnArchName"):
        assert getattr(p, none_field) is None, none_field
    assert len(p.uuid.bytes) == 16 and all(isinstance(b, int) for b in p.uuid.bytes)
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", str(p.uuid))


@pytest.mark.npu_chip("Ascend910B4")
def test_device_properties_repr_uses_mib_floats(npugraph):
    p = torch.npu.get_device_properties()
    mib = p.L2_cache_size / 1024.0 ** 2
    assert repr(p) == (f"_NPUDeviceProperties(name='Ascend910B4', total_memory=32768.0MB, cube_core_num=20, "
                       f"vector_core_num=40, uuid={p.uuid}, L2_cache_size={mib}MB)")


def _chip(name, cube, vector, gib):
    return pytest.param(name, cube, vector, gib, marks=pytest.mark.npu_chip(name), id=name)


@pytest.mark.parametrize("chip, cube, vector, gib", [
    _chip("Ascend910B1", 24, 48, 64), _chip("Ascend910B3", 20, 40, 64), _chip("Ascend910B4", 20, 40, 32),
    _chip("Ascend910_9392", 24, 48, 64),
])
def test_chip_profiles(npugraph, chip, cube, vector, gib):
    p = torch.npu.get_device_properties()
    assert (npugraph.chip, npugraph.cube_cores, npugraph.vector_cores) == (chip, cube, vector)
    assert (p.name, p.cube_core_num, p.vector_core_num, p.total_memory) == (chip, cube, vector, gib * 2**30)
    assert torch.npu.get_device_limit(0) == {"cube_core_num": cube, "vector_core_num": vector}
    assert torch.npu.mem_get_info() == (gib * 2**30, gib * 2**30)


@pytest.mark.npu_cores(aicore=8)
def test_npu_cores_marker_overrides_the_profile(npugraph):
    p = torch.npu.get_device_properties()
    assert (p.cube_core_num, p.vector_core_num) == (8, 16) == (npugraph.cube_cores, npugraph.vector_cores)


@pytest.mark.npu_devices(2)
def test_device_context_manager(npugraph):
    with torch.npu.device(1):
        assert torch.npu.current_device() == 1
        with torch.npu.device("npu:0"):
            assert torch.npu.current_device() == 0
        assert torch.npu.current_device() == 1
        with torch.npu.device(-1):           # negative: no-op
            assert torch.npu.current_device() == 1
        with torch.npu.device(None):         # None: the current device
            assert torch.npu.current_device() == 1
    assert torch.npu.current_device() == 0


@pytest.mark.npu_devices(2)
def test_device_context_restores_on_error_and_does_not_swallow(npugraph):
    with pytest.raises(KeyError):
        with torch.npu.device(torch.device("npu", 1)):
            raise KeyError("boom")
    assert torch.npu.current_device() == 0


@pytest.mark.npu_devices(2)
def test_device_of(npugraph):
    t = torch.zeros(2, device="npu:1")
    with torch.npu.device_of(t):
        assert torch.npu.current_device() == 1
    assert torch.npu.current_device() == 0
    with torch.npu.device_of(torch.zeros(2)):   # a CPU tensor: no-op
        assert torch.npu.current_device() == 0


def test_get_device_capability(npugraph, monkeypatch):
    monkeypatch.delenv("TORCH_NPU_DEVICE_CAPABILITY", raising=False)
    with pytest.warns(UserWarning, match="TORCH_NPU_DEVICE_CAPABILITY"):
        assert torch.npu.get_device_capability() is None
    monkeypatch.setenv("TORCH_NPU_DEVICE_CAPABILITY", "8.0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.npu.get_device_capability(0) == (8, 0)
    monkeypatch.setenv("TORCH_NPU_DEVICE_CAPABILITY", "eight")
    with pytest.warns(UserWarning, match="can't parse TORCH_NPU_DEVICE_CAPABILITY"):
        assert torch.npu.get_device_capability() is None


def test_lazy_initialisation_is_per_test(npugraph):
    assert torch.npu.is_initialized() is False   # every test starts on a fresh machine
    assert torch.npu.memory_stats() == {}
    torch.npu.get_device_name(0)                 # validates only: no initialisation
    torch.npu.empty_cache()                      # a no-op before initialisation
    assert torch.npu.is_initialized() is False
    torch.npu.init()
    assert torch.npu.is_initialized() is True
    assert torch.npu.memory_stats()["allocation.all.current"] == 0


@pytest.mark.npu_devices(2)
def test_current_device_and_stream_are_per_thread(npugraph):
    s = torch.npu.Stream()
    torch.npu.set_stream(s)
    seen = {}

    def worker():
        seen["before"] = (torch.npu.current_device(), torch.npu.current_stream().stream_id)
        torch.npu.set_device(1)
        seen["after"] = torch.npu.current_device()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == {"before": (0, 0), "after": 1}
    assert torch.npu.current_device() == 0 and torch.npu.current_stream() == s
