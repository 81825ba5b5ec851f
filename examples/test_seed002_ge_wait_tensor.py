"""Seed 002: multi-stream GE graphs (``max-autotune``) with ``npu_wait_tensor``, and the same model
moved to reduce-overhead mode.

In GE mode the compiler synchronises data edges between streams itself; ``npu_wait_tensor`` only
adds ordering where there is no data edge (the seed's add2 waits for mm_result although it does
not read it).  A model whose stream '2' consumes stream '1''s result is therefore clean in GE mode,
but moved to reduce-overhead mode unchanged (``npu_wait_tensor`` is not supported there, so it is
dropped) the same data edge is an unsynchronised race: it needs a tagged event (see seed 001).
"""
import torch
import torch_npu
import torchair as tng
from torchair.configs.compiler_config import CompilerConfig

N = 64


class SeedModel(torch.nn.Module):
    """The seed's model: wait_tensor orders ops that share no data."""

    def forward(self, in1, in2, in3, in4):
        add_result = torch.add(in1, in2)
        with tng.scope.npu_stream_switch('1'):
            tng.scope.npu_wait_tensor(in4, add_result)
            mm_result = torch.mm(in3, in4)
        mm1 = torch.mm(in3, in4)
        with tng.scope.npu_stream_switch('2'):
            tng.scope.npu_wait_tensor(in4, mm_result)
            add2 = torch.add(in3, in4)
        return add_result, mm_result, mm1, add2


class DataEdgeModel(torch.nn.Module):
    """Stream '2' reads what stream '1' and the main stream produce."""

    def forward(self, in1, in2, in3, in4):
        add_result = torch.add(in1, in2)
        with tng.scope.npu_stream_switch('1'):
            mm_result = torch.mm(in3, in4)
        mm1 = torch.mm(in3, in4)
        with tng.scope.npu_stream_switch('2'):
            add2 = torch.add(mm_result, add_result)
        return add_result, mm_result, mm1, add2


def compiled(model, mode):
    config = CompilerConfig()
    config.mode = mode
    return torch.compile(model, backend=tng.get_npu_backend(compiler_config=config), dynamic=False, fullgraph=True)


def inputs():
    g = torch.Generator().manual_seed(2)
    return [torch.randn(N, N, generator=g).npu() for _ in range(4)]


def test_seed_model_in_ge_mode_is_clean_and_ordered(npugraph):
    in1, in2, in3, in4 = inputs()
    add_result, mm_result, mm1, add2 = compiled(SeedModel(), "max-autotune")(in1, in2, in3, in4)
    torch.testing.assert_close(mm_result.cpu(), in3.cpu() @ in4.cpu())
    torch.testing.assert_close(add2.cpu(), in3.cpu() + in4.cpu())
    (record,) = npugraph.graphs
    assert record.mode == "max-autotune" and record.stream_of("aten.mm") == "1"
    npugraph.assert_clean()


def test_data_edges_between_streams_are_synchronised_by_ge(npugraph):
    in1, in2, in3, in4 = inputs()
    *_, add2 = compiled(DataEdgeModel(), "max-autotune")(in1, in2, in3, in4)
    torch.testing.assert_close(add2.cpu(), in3.cpu() @ in4.cpu() + in1.cpu() + in2.cpu())
    npugraph.assert_clean()


def test_the_same_data_edges_race_in_reduce_overhead_mode(npugraph):
    with npugraph.expect("race", match=r"reads it in aten::add.Tensor .* writing it in aten::mm"):
        with npugraph.expect("race", match=r"reads it in aten::add.Tensor .* writing it in aten::add.Tensor"):
            compiled(DataEdgeModel(), "reduce-overhead")(*inputs())
