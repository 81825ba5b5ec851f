"""Ordinary model code that copies and checkpoints NPU tensors: deepcopy, pickle, torch.save/load.

Before the fix ``copy.deepcopy`` of an npu tensor segfaulted the pytest process (torch copied the
wrapper's storage, which holds no bytes) and ``torch.save`` failed on an "invalid python storage".
"""
import copy
import io
import pickle

import pytest
import torch
import torch_npu  # noqa: F401

from pytest_npugraph import trace as T


def kernels(npugraph, op):
    return [r for r in npugraph.trace.records if isinstance(r, T.Kernel) and r.op == op]


def test_deepcopy_of_a_tensor_is_an_independent_npu_copy(npugraph):
    t = torch.randn(3, device="npu")
    c = copy.deepcopy(t)
    assert c.device == t.device and c.data_ptr() != t.data_ptr()
    assert torch.equal(c.cpu(), t.cpu())
    c.add_(1)
    assert not torch.equal(c.cpu(), t.cpu())
    # the copy is a device task reading the source (so a race on it is seen)
    (task,) = kernels(npugraph, "aten::clone (deepcopy)")
    assert task.reads and task.writes


def test_deepcopy_of_a_module_keeps_parameters_grads_and_outputs(npugraph):
    m = torch.nn.Linear(4, 4).npu()
    x = torch.randn(2, 4, device="npu")
    m(x).sum().backward()
    c = copy.deepcopy(m)
    assert isinstance(c.weight, torch.nn.Parameter) and c.weight.requires_grad
    assert c.weight.device.type == "npu" and torch.equal(c.weight.grad.cpu(), m.weight.grad.cpu())
    assert torch.equal(c(x).cpu(), m(x).cpu())
    with torch.no_grad():
        c.weight.zero_()
    assert m.weight.abs().sum().item() > 0


def test_deepcopy_keeps_views_of_one_storage_together(npugraph):
    t = torch.randn(4, device="npu")
    whole, tail = copy.deepcopy([t, t[1:]])
    whole[1] = 100.0
    assert tail[0].item() == 100.0 and t[1].item() != 100.0


def test_deepcopy_of_a_non_leaf_fails_as_in_torch(npugraph):
    x = torch.randn(2, device="npu", requires_grad=True) * 2
    with pytest.raises(RuntimeError, match="Only Tensors created explicitly by the user"):
        copy.deepcopy(x)


def test_state_dict_save_load_round_trip(npugraph, tmp_path):
    m = torch.nn.Linear(4, 4).npu()
    path = tmp_path / "ckpt.pt"
    torch.save(m.state_dict(), path)
    loaded = torch.load(path)                 # weights_only=True, the default
    assert loaded["weight"].device == torch.device("npu", 0)
    assert torch.equal(loaded["weight"].cpu(), m.weight.cpu())
    on_host = torch.load(path, map_location="cpu")
    assert on_host["weight"].device.type == "cpu" and type(on_host["weight"]) is torch.Tensor
    fresh = torch.nn.Linear(4, 4).npu()
    fresh.load_state_dict(on_host)
    x = torch.randn(3, 4, device="npu")
    assert torch.equal(fresh(x).cpu(), m(x).cpu())
    # saving is a device-to-host read of each tensor
    assert len(kernels(npugraph, "aten::_to_copy (save)")) == 2


def test_load_onto_a_missing_device_fails_like_torch(npugraph):
    buf = io.BytesIO()
    torch.save(torch.ones(2, device="npu"), buf)
    buf.seek(0)
    with pytest.raises(RuntimeError, match="Attempting to deserialize object on NPU device 3 but "
                                           r"torch.npu.device_count\(\) is 1"):
        torch.load(buf, map_location="npu:3")


@pytest.mark.npu_devices(2)
def test_load_with_map_location_moves_between_npus(npugraph):
    buf = io.BytesIO()
    torch.save({"a": torch.arange(3.0, device="npu:0")}, buf)
    buf.seek(0)
    moved = torch.load(buf, map_location="npu:1")
    assert moved["a"].device == torch.device("npu", 1) and moved["a"].cpu().tolist() == [0.0, 1.0, 2.0]


def test_pickle_round_trip_of_tensors_and_modules(npugraph):
    t = torch.randn(3, device="npu")
    u = pickle.loads(pickle.dumps(t))
    assert u.device.type == "npu" and torch.equal(u.cpu(), t.cpu()) and u.data_ptr() != t.data_ptr()
    m = pickle.loads(pickle.dumps(torch.nn.Linear(2, 2).npu()))
    assert isinstance(m.weight, torch.nn.Parameter) and m.weight.device.type == "npu"
    assert m(torch.ones(1, 2, device="npu")).shape == (1, 2)


def test_shared_storage_survives_save_and_load(npugraph):
    base = torch.arange(4.0, device="npu")
    buf = io.BytesIO()
    torch.save([base, base[2:]], buf)
    buf.seek(0)
    a, b = torch.load(buf)
    a[2] = -1.0
    assert b[0].item() == -1.0


def test_untyped_storage_data_ptr_is_the_device_address(npugraph):
    t = torch.randn(8, device="npu")
    s = t.untyped_storage()
    assert s.data_ptr() == t.data_ptr() == t[3:].untyped_storage().data_ptr()
    assert s.nbytes() == 32 and s.device == t.device
    assert torch.randn(8, device="npu").untyped_storage().data_ptr() != s.data_ptr()


def test_param_data_assignment_replaces_the_values(npugraph):
    p = torch.nn.Parameter(torch.zeros(3, device="npu"))
    p.data = torch.ones(3, device="npu")
    assert (p * 2).cpu().tolist() == [2.0, 2.0, 2.0]
    p.data = torch.arange(4.0, device="npu")       # another shape, as weight loading may do
    assert p.shape == (4,) and (p + 0).cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert isinstance(p, torch.nn.Parameter)


def test_module_half_and_to_dtype_convert_the_values(npugraph):
    m = torch.nn.Linear(2, 2).npu()
    ref = m.weight.detach().cpu().half()
    m.half()
    assert m.weight.dtype == torch.float16 and torch.equal(m.weight.cpu(), ref)
    assert m(torch.randn(1, 2, device="npu", dtype=torch.float16)).dtype == torch.float16
