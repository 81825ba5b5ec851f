"""``Tensor.storage()`` of an NPU tensor (torch's deprecated but still common ``TypedStorage``).

Before the fix it wrapped the wrapper tensor's own storage, which holds no bytes: ``data_ptr()``
raised "invalid python storage", ``s[i]``/``tolist()`` and ``x.set_(x.storage(), ...)`` raised
"Attempted to set the storage of a tensor on device cpu to a storage on different device npu:0".
The semantics are torch_npu's (its test/npu/test_tensor.py: test_tensor_set, test_set_storage).
"""
import warnings

import pytest
import torch
import torch_npu  # noqa: F401

from pytest_npugraph import trace as T

pytestmark = pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")


def test_storage_answers_for_the_device(npugraph):
    t = torch.arange(6.0, device="npu")
    s = t.storage()
    assert isinstance(s, torch.TypedStorage)
    assert s.data_ptr() == t.untyped_storage().data_ptr() == t.data_ptr()
    assert t[2:].storage().data_ptr() == s.data_ptr()          # a view's storage is the base's
    assert torch.zeros(6, device="npu").storage().data_ptr() != s.data_ptr()
    assert s.size() == len(s) == 6
    assert s.dtype == torch.float32 and s.element_size() == 4 and s.nbytes() == 24
    assert s.device == torch.device("npu", 0) and s.get_device() == 0
    assert s.is_npu and not s.is_cuda
    assert s.type() == "torch.npu.FloatStorage"
    assert torch.ones(2, device="npu", dtype=torch.int64).storage().type() == "torch.npu.LongStorage"
    assert s.untyped().data_ptr() == s.data_ptr() and s.untyped().device == s.device
    assert t.storage()._cdata == t[1:].storage()._cdata      # one storage (StorageWeakRef keys)


def test_reading_values_is_a_host_read_of_the_device(npugraph):
    t = torch.arange(4.0, device="npu") * 10
    s = t.storage()
    before = len([r for r in npugraph.trace.records if isinstance(r, T.HostSync)])
    assert s[1] == 10.0 and s[-1] == 30.0
    syncs = [r for r in npugraph.trace.records if isinstance(r, T.HostSync)]
    assert len(syncs) == before + 2 and all(r.what == "read" for r in syncs[before:])
    assert s.tolist() == [0.0, 10.0, 20.0, 30.0]
    host = s.cpu()
    assert host.device == torch.device("cpu") and host.tolist() == [0.0, 10.0, 20.0, 30.0]
    t.add_(1)                                   # the host copy is a copy
    assert host.tolist() == [0.0, 10.0, 20.0, 30.0] and s.tolist() == [1.0, 11.0, 21.0, 31.0]
    with pytest.raises(IndexError):
        s[4]


def test_writing_an_element_is_device_work(npugraph):
    t = torch.zeros(3, device="npu")
    t.storage()[1] = 5.0
    assert t.cpu().tolist() == [0.0, 5.0, 0.0]


def test_set_storage_makes_views_of_the_same_block(npugraph):
    a = torch.arange(12.0, device="npu")
    b = torch.empty(0, device="npu").set_(a.storage())
    assert b.data_ptr() == a.data_ptr() and b.cpu().tolist() == a.cpu().tolist()
    c = torch.empty(0, device="npu").set_(a.storage(), 2, (2, 3), (3, 1))
    assert c.data_ptr() == a.data_ptr() + 8 and c.device == a.device
    assert c.cpu().tolist() == [[2.0, 3.0, 4.0], [5.0, 6.0, 7.0]]
    c.mul_(0)                                   # a view: writes reach a
    assert a.cpu().tolist()[1:9] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 8.0]
    x = torch.randn(1, 2, 3, device="npu")
    x.set_(x.storage(), x.storage_offset(), x.size(), x.stride())
    y = torch.randn(1, 2, 3, device="npu").set_(source=a.storage(), storage_offset=0, size=(2, 2), stride=(2, 1))
    assert y.data_ptr() == a.data_ptr()
    d = torch.empty(0, device="npu").set_(a.storage().untyped(), 0, (4,), (1,))     # and the untyped storages
    e = torch.empty(0, device="npu").set_(a.untyped_storage())
    assert d.data_ptr() == e.data_ptr() == a.data_ptr() and e.numel() == 12


def test_set_to_a_tensor_of_the_same_shape_takes_its_block(npugraph):
    a, b = torch.ones(3, device="npu"), torch.zeros(3, device="npu")
    a.set_(b)
    assert a.data_ptr() == b.data_ptr() and a.storage()._cdata == b.storage()._cdata
    b.add_(2)
    assert a.cpu().tolist() == [2.0, 2.0, 2.0]
    assert not [r for r in npugraph.trace.records if isinstance(r, T.Kernel) and r.op.startswith("aten::set_")]


def test_storage_keeps_its_memory_alive(npugraph):
    t = torch.arange(4.0, device="npu")
    s = t.storage()
    address = s.data_ptr()
    del t
    u = torch.empty(0, device="npu").set_(s)
    assert u.data_ptr() == address and u.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_clone_is_new_device_memory(npugraph):
    s = torch.arange(3.0, device="npu").storage()
    c = s.clone()
    assert c.device == s.device and c.data_ptr() != s.data_ptr() and c.tolist() == [0.0, 1.0, 2.0]


def test_host_storages_are_unchanged(npugraph):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = torch.arange(3.0).storage()
    assert type(s) is torch.TypedStorage and s.device.type == "cpu" and s[2] == 2.0
