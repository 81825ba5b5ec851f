"""One device resolver (``backend.device_index``): a bare ``"npu"`` is the calling thread's current device.

Why: torch_npu's C++ device guard answers "which npu" for every path that takes a bare ``"npu"``; a
Python backend's guard cannot (torch 2.13 answers index 0 from C++), so before this a rank-1 thread's
``torch.tensor(data, device="npu")`` landed on npu:0 -- a blocking copy on another rank's busy
stream, and a false DeviceHang in multi-rank tests.  Each path below must land on the thread's
device, in eager code and in compiled regions, and ``.to("npu:1")`` of an npu:0 tensor is a
device-to-device copy onto npu:1.
"""
import io

import numpy as np
import pytest
import torch

import torch_npu  # noqa: F401
from pytest_npugraph.runtime import backend
from pytest_npugraph.trace import EventRecord, EventWait, Kernel

VALUES = [1.0, 2.0, 3.0]


def _module_to(spelling):
    m = torch.nn.Linear(2, 3)
    with torch.no_grad():
        m.bias.copy_(torch.tensor(VALUES))
    return m.to(spelling).bias.detach()


def _loaded(map_location):
    buffer = io.BytesIO()
    torch.save(torch.tensor(VALUES, device="npu:0"), buffer)
    buffer.seek(0)
    return torch.load(buffer, map_location=map_location)


# each: a bare-npu path -> (tensor made on the thread's device, the values it must hold)
PATHS = {
    "tensor": lambda: torch.tensor(VALUES, device="npu"),
    "tensor(device=torch.device('npu'))": lambda: torch.tensor(VALUES, device=torch.device("npu")),
    "as_tensor": lambda: torch.as_tensor(VALUES, device="npu"),
    "as_tensor(dtype=, device=torch.device)": lambda: torch.as_tensor(VALUES, dtype=torch.float32,
                                                                      device=torch.device("npu")),
    "asarray": lambda: torch.asarray(VALUES, device="npu"),
    "from_numpy().to": lambda: torch.from_numpy(np.array(VALUES, dtype=np.float32)).to("npu"),
    "Tensor.to(torch.device)": lambda: torch.tensor(VALUES).to(torch.device("npu")),
    "Tensor.to(device=, dtype=)": lambda: torch.tensor(VALUES).to(device="npu", dtype=torch.float32),
    "Tensor.npu()": lambda: torch.tensor(VALUES).npu(),
    "Module.to": lambda: _module_to("npu"),
    "empty+fill_": lambda: torch.empty(3, device="npu").copy_(torch.tensor(VALUES)),
    "zeros+add": lambda: torch.zeros(3, device=torch.device("npu")).add_(torch.tensor(VALUES).npu()),
    "full": lambda: torch.full((3,), 2.0, device="npu").mul_(torch.tensor(VALUES).npu()) / 2,
    "torch.load(map_location='npu')": lambda: _loaded("npu"),
}


def _check(made, want_index):
    assert made.device == torch.device("npu", want_index)
    assert made.cpu().tolist() == VALUES


@pytest.mark.npu_devices(2)
@pytest.mark.parametrize("path", list(PATHS))
def test_after_set_device_a_bare_npu_is_npu1(npugraph, path):
    _check(PATHS[path](), 0)          # the same call before set_device: npu:0
    torch.npu.set_device(1)
    _check(PATHS[path](), 1)
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
@pytest.mark.parametrize("path", list(PATHS))
def test_in_run_ranks_a_bare_npu_is_the_ranks_device(npugraph, path):
    def fn(rank):
        made = PATHS[path]()
        return made.device, made.cpu().tolist()

    assert npugraph.run_ranks(fn) == [(torch.device("npu", r), VALUES) for r in (0, 1)]
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
def test_new_tensor_of_an_npu1_tensor_is_on_npu1(npugraph):
    x = torch.ones(2, device="npu:1")       # current device stays 0: the result follows x, not the thread
    y = x.new_tensor(VALUES)
    assert y.device == torch.device("npu", 1) and y.cpu().tolist() == VALUES
    assert torch.zeros_like(x).device.index == 1
    assert torch.zeros_like(torch.ones(2, device="npu:0"), device="npu:1").device.index == 1


@pytest.mark.npu_devices(2)
def test_device_index_spellings(npugraph):
    for spelling in (None, "npu", torch.device("npu")):
        assert backend.device_index(spelling) == 0
    torch.npu.set_device(1)
    for spelling in (None, "npu", torch.device("npu"), 1, "npu:1", torch.device("npu", 1)):
        assert backend.device_index(spelling) == 1
    assert backend.device_index("npu:0") == 0 == backend.device_index(0)
    with pytest.raises(ValueError, match="Expected a npu device, but got: cpu"):
        backend.device_index("cpu")
    with pytest.raises(TypeError, match="Expected a npu device"):
        backend.device_index(1.5)


@pytest.mark.npu_devices(2)
def test_threads_keep_their_own_device(npugraph):
    """The resolver asks the calling thread: another thread's set_device does not move this one's."""
    import threading

    seen = {}

    def other():
        torch.npu.set_device(1)
        seen["other"] = torch.tensor([1.0], device="npu").device.index

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen["other"] == 1
    assert torch.tensor([1.0], device="npu").device.index == 0


def _bare_npu_fn(x):
    a = torch.ones(3, device=torch.device("npu"))
    b = torch.tensor(VALUES, device="npu")
    c = x.to("npu")
    return a + b + c


@pytest.mark.npu_devices(2)
@pytest.mark.parametrize("backend_name", ["eager", "aot_eager", "npu"])
def test_compiled_after_set_device_a_bare_npu_is_npu1(npugraph, backend_name):
    torch._dynamo.reset()
    torch.npu.set_device(1)
    out = torch.compile(_bare_npu_fn, backend=backend_name)(torch.ones(3))
    assert out.device == torch.device("npu", 1) and out.cpu().tolist() == [2.0 + v for v in VALUES]
    torch._dynamo.reset()
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
def test_a_compiled_graph_resolves_a_bare_npu_in_the_thread_running_it(npugraph):
    """The eager backend runs the FX graph, which keeps the bare device: whichever rank compiled it,
    each rank's run lands on its own device.  (Backends that trace to aten bake the device the
    tracing thread resolved, as torch does for any device; ranks sharing one process's compile
    cache then share that device: per-device graphs are issue 24 item 2.)"""
    torch._dynamo.reset()
    compiled = torch.compile(_bare_npu_fn, backend="eager")
    want = [2.0 + v for v in VALUES]

    def fn(rank):
        out = compiled(torch.ones(3))
        return out.device, out.cpu().tolist()

    assert npugraph.run_ranks(fn) == [(torch.device("npu", r), want) for r in (0, 1)]
    torch._dynamo.reset()
    npugraph.assert_clean()


# ------------------------------------------------------------- across devices
def _copies(npugraph):
    return [r for r in npugraph.trace.records if isinstance(r, Kernel) and r.op.endswith("(D2D)")]


def _sid(npugraph, device):
    return next(s.sid for s in npugraph.trace.streams.values() if s.device == device and s.stream_id == 0)


@pytest.mark.npu_devices(2)
@pytest.mark.parametrize("spelling", ["npu:1", torch.device("npu", 1), 1])
def test_to_another_npu_is_a_device_to_device_copy(npugraph, spelling):
    x = torch.arange(4.0, device="npu:0") * 3
    y = x.to(spelling) if spelling != 1 else x.npu(1)
    assert y.device == torch.device("npu", 1)
    assert y.cpu().tolist() == [0.0, 3.0, 6.0, 9.0]
    assert x.device.index == 0
    (copy,) = _copies(npugraph)
    assert copy.stream == _sid(npugraph, 0)                # on the source device's current stream
    assert {s.device for s in copy.reads} == {0} and {s.device for s in copy.writes} == {1}
    z = y + 1                                              # npu:1's stream waits for the copy: no race
    assert z.cpu().tolist() == [1.0, 4.0, 7.0, 10.0]
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
def test_copy_between_devices_is_ordered_with_both_current_streams(npugraph):
    x = torch.full((4,), 2.0, device="npu:0")
    y = torch.ones(4, device="npu:1")          # npu:1's stream writes y before the copy overwrites it
    y.copy_(x)
    records = npugraph.trace.records
    (copy,) = _copies(npugraph)
    before = [r for r in records if isinstance(r, (EventRecord, EventWait)) and r.seq < copy.seq]
    after = [r for r in records if isinstance(r, (EventRecord, EventWait)) and r.seq > copy.seq]
    s0, s1 = _sid(npugraph, 0), _sid(npugraph, 1)
    assert [(type(r), r.stream) for r in before[-2:]] == [(EventRecord, s1), (EventWait, s0)]
    assert [(type(r), r.stream) for r in after[:2]] == [(EventRecord, s0), (EventWait, s1)]
    assert (y * 2).cpu().tolist() == [4.0] * 4
    npugraph.assert_clean()


@pytest.mark.npu_devices(2)
def test_copy_racing_with_a_side_stream_of_the_destination_is_reported(npugraph):
    """The copy waits for the destination's current stream only (as torch's does): a side stream
    of npu:1 still writing ``y`` races with it."""
    x = torch.full((4,), 2.0, device="npu:0")
    y = torch.ones(4, device="npu:1")
    side = torch.npu.Stream(device="npu:1")
    side.wait_stream(torch.npu.current_stream(1))
    with npugraph.expect("race", match="copy_"):
        with torch.npu.stream(side):
            y.mul_(5)
        y.copy_(x)
    torch.npu.synchronize(1)
