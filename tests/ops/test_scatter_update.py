"""``torch_npu.scatter_update(_)``: each batch's new rows written into a static KV cache along an
axis (TorchAir's llama examples update ``past_key_value`` this way), checked against the docs'
example and an independent per-element loop."""
import pytest
import torch

import torch_npu
from graph.helpers import backend


def _expected(data, indices, updates, axis):
    out = data.clone()
    dim = axis % data.dim()
    for b in range(data.size(0)):
        for j in range(updates.size(dim)):
            src = [slice(None)] * data.dim()
            dst = [slice(None)] * data.dim()
            src[0] = dst[0] = b
            src[dim], dst[dim] = j, int(indices[b]) + j
            out[tuple(dst)] = updates[tuple(src)]
    return out


def test_the_docs_example(npugraph):
    data = torch.tensor([[[[1.0] * 8, [2.0] * 8]]]).npu()
    indices = torch.tensor([1]).npu()
    updates = torch.tensor([[[[3.0] * 8]]]).npu()
    out = torch_npu.scatter_update_(data, indices, updates, axis=-2)
    assert out is data
    assert data.cpu().tolist() == [[[[1.0] * 8, [3.0] * 8]]]


@pytest.mark.parametrize("axis", [-2, -1, 1])
def test_rows_land_from_each_batchs_index_and_the_rest_is_kept(npugraph, axis):
    g = torch.Generator().manual_seed(0)
    data = torch.randn(3, 2, 6, 5, generator=g)
    shape = list(data.shape)
    shape[axis % 4] = 2
    updates = torch.randn(*shape, generator=g)
    size = data.size(axis % 4)
    indices = torch.tensor([0, size - 2, size // 2 - 1], dtype=torch.int32)
    want = _expected(data, indices, updates, axis)
    functional = torch_npu.scatter_update(data.npu(), indices.npu(), updates.npu(), axis)
    torch.testing.assert_close(functional.cpu(), want)
    in_place = data.npu()
    torch_npu.scatter_update_(in_place, indices.npu(), updates.npu(), axis)
    torch.testing.assert_close(in_place.cpu(), want)


@pytest.mark.parametrize("indices, updates, message", [
    (torch.tensor([5, 0]), torch.randn(2, 2, 2, 4), "past the end"),
    (torch.tensor([[0, 1], [1, 0]]), torch.randn(2, 2, 2, 4), "not emulated"),
    (torch.tensor([0.0, 1.0]), torch.randn(2, 2, 2, 4), "int32 or int64"),
    (torch.tensor([0, 1]), torch.randn(2, 3, 2, 4), "must match data"),
])
def test_bad_arguments_are_refused(npugraph, indices, updates, message):
    with pytest.raises(RuntimeError, match=message):
        torch_npu.scatter_update_(torch.zeros(2, 2, 6, 4).npu(), indices.npu(), updates.npu(), -2)


def _append(cache, positions, new):
    torch_npu.scatter_update_(cache, positions, new, -2)
    return cache.sum(dim=-2)


@pytest.mark.parametrize("mode", ["ge", "reduce-overhead"])
def test_a_compiled_cache_update_gives_the_eager_values(npugraph, mode):
    step = torch.compile(_append, backend=backend(mode), dynamic=False)
    cache, cache_cpu = torch.zeros(2, 2, 6, 4).npu(), torch.zeros(2, 2, 6, 4)
    for t in range(3):
        positions, new = torch.tensor([t, t + 1]), torch.full((2, 2, 1, 4), float(t + 1))
        cache_cpu = _expected(cache_cpu, positions, new, -2)
        got = step(cache, positions.npu(), new.npu())
        torch.testing.assert_close(got.cpu(), cache_cpu.sum(dim=-2))
        torch.testing.assert_close(cache.cpu(), cache_cpu)
    npugraph.assert_clean()


def _write_slots(cache, slots, rows):
    torch_npu.npu_scatter_nd_update_(cache, slots, rows)
    return cache * 2


def test_other_in_place_ops_with_an_out_of_place_twin_compile_too(npugraph):
    """npu_scatter_nd_update_ pairs with npu_scatter_nd_update the same way (torch_npu's in-place table)."""
    step = torch.compile(_write_slots, backend=backend("ge"), dynamic=False)
    cache = torch.zeros(6, 4).npu()
    slots, rows = torch.tensor([[4], [1]], dtype=torch.int32), torch.ones(2, 4)
    got = step(cache, slots.npu(), rows.npu())
    want = torch.zeros(6, 4)
    want[[4, 1]] = 1.0
    torch.testing.assert_close(cache.cpu(), want)
    torch.testing.assert_close(got.cpu(), want * 2)
