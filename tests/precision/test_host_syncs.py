"""Ops whose result shape (or value) the host needs block the host on their stream, as on hardware.

Every aten op with a data-dependent output is listed here, each with what makes it one; the host
then waits for the stream, so work issued afterwards on any stream is ordered after it.
Ops with a data-dependent computation but a fixed output shape (``histc``, ``masked_scatter``,
``nonzero_static``, ``repeat_interleave`` given ``output_size``, indexing with integer tensors) do
not block the host.
"""
import pytest
import torch
import torch_npu  # noqa: F401

from pytest_npugraph import trace as T

# name -> (what the test runs on b (16 floats) and r (4 ints), the aten op that reads to the host)
DATA_DEPENDENT = {
    "boolean-mask indexing": (lambda b, r: b[b > 0.5], "aten::index.Tensor"),
    "boolean-mask assignment": (lambda b, r: b.__setitem__(b > 2.0, 0.0), "aten::index_put_"),
    "repeat_interleave(tensor)": (lambda b, r: torch.repeat_interleave(r), "aten::repeat_interleave.Tensor"),
    "tensor.repeat_interleave(tensor)": (lambda b, r: b[:4].repeat_interleave(r), "aten::repeat_interleave.Tensor"),
    "nonzero": (lambda b, r: b.nonzero(), "aten::nonzero"),
    "where(cond)": (lambda b, r: torch.where(b > 0.5), "aten::nonzero"),
    "argwhere": (lambda b, r: torch.argwhere(b), "aten::nonzero"),
    "masked_select": (lambda b, r: b.masked_select(b > 0.5), "aten::masked_select"),
    "unique": (lambda b, r: torch.unique(r), "aten::_unique2"),
    "unique(dim)": (lambda b, r: torch.unique(r, dim=0), "aten::unique_dim"),
    "unique_consecutive": (lambda b, r: torch.unique_consecutive(r), "aten::unique_consecutive"),
    "bincount": (lambda b, r: torch.bincount(r), "aten::bincount"),
    "item": (lambda b, r: b.sum().item(), "aten::_local_scalar_dense"),
    "bool()": (lambda b, r: bool(b.any()), "aten::_local_scalar_dense"),
    "narrow(tensor start)": (lambda b, r: b.narrow(0, r[0], 2), "aten::_local_scalar_dense"),
    "equal": (lambda b, r: torch.equal(b, b), "aten::equal"),
    "allclose": (lambda b, r: torch.allclose(b, b), "aten::allclose"),
}

FIXED_SHAPE = {
    "integer indexing": lambda b, r: b[r],
    "repeat_interleave(tensor, output_size=)": lambda b, r: b[:4].repeat_interleave(r, output_size=4),
    "masked_scatter": lambda b, r: b.masked_scatter(b > 0.5, torch.zeros(16, device="npu")),
    "histc": lambda b, r: torch.histc(b),
    "masked_fill": lambda b, r: b.masked_fill(b > 0.5, 0.0),
}


def operands():
    b = torch.rand(16, device="npu")
    r = torch.tensor([1, 2, 0, 1], device="npu")
    torch.npu.synchronize()
    return b, r


def host_reads(npugraph, start):
    recs = npugraph.trace.records[start:]
    return [(recs[i - 1].op if isinstance(recs[i - 1], T.Kernel) else None)
            for i, r in enumerate(recs) if isinstance(r, T.HostSync) and r.what == "read" and i]


@pytest.mark.parametrize("name", DATA_DEPENDENT)
def test_data_dependent_op_blocks_the_host_on_its_stream(npugraph, name):
    run, op = DATA_DEPENDENT[name]
    b, r = operands()
    start = len(npugraph.trace)
    run(b, r)
    assert any(k is not None and k.startswith(op) for k in host_reads(npugraph, start)), host_reads(npugraph, start)


@pytest.mark.parametrize("name", FIXED_SHAPE)
def test_fixed_shape_op_does_not_block_the_host(npugraph, name):
    b, r = operands()
    start = len(npugraph.trace)
    FIXED_SHAPE[name](b, r)
    assert host_reads(npugraph, start) == []


@pytest.mark.parametrize("name", ["boolean-mask indexing", "repeat_interleave(tensor)", "nonzero"])
def test_work_after_a_data_dependent_op_is_ordered_after_its_stream(npugraph, name):
    b, r = operands()
    x = torch.zeros(16, device="npu")
    x.add_(1)                                   # main stream writes x ...
    DATA_DEPENDENT[name][0](b, r)               # ... then the host waits for main
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        total = x.sum()                         # issued after the host read: ordered
    torch.npu.current_stream().wait_stream(side)
    assert npugraph.hazards == []
    assert total.item() == 16


def test_without_the_host_read_the_same_code_races(npugraph):
    b, r = operands()
    x = torch.zeros(16, device="npu")
    x.add_(1)
    b[r]                                        # integer indexing: no host read
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        with npugraph.expect("race", match="reads it in aten::sum"):
            x.sum()
