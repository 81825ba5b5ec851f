"""TorchAir's pattern fusion (``experimental_config.pattern_fusion_pass``, on by default): an
``npu_add_rms_norm`` whose result is cast to float32 becomes ``npu_add_rms_norm_cast``, one followed by
``npu_dynamic_quant`` becomes ``npu_add_rms_norm_dynamic_quant``, in GE and aclgraph modes; the values
are the unfused chain's; chains split over streams, or with the option off, stay."""
import pytest
import torch
import torch_npu  # noqa: F401
import torchair

NORM = torch.ops.npu.npu_add_rms_norm.default
CAST = torch.ops.npu.npu_add_rms_norm_cast.default
QUANT = torch.ops.npu.npu_add_rms_norm_dynamic_quant.default


def _compiled(fn, mode="max-autotune", fusion=True, dynamic=False):
    seen = []

    def post(gm, example_inputs, config):
        seen.append([n.target for n in gm.graph.nodes if n.op == "call_function"])

    config = torchair.CompilerConfig()
    config.mode = mode
    config.experimental_config.pattern_fusion_pass = fusion
    config.post_grad_custom_post_pass = post
    return torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=config), dynamic=dynamic), seen


def _inputs(shape=(1, 2, 8), dtype=torch.float16):
    torch.manual_seed(0)
    x1, x2 = torch.randn(*shape, dtype=dtype).npu(), torch.randn(*shape, dtype=dtype).npu()
    return x1, x2, (torch.rand(shape[-1], dtype=dtype) + 0.5).npu()


def _cast(x1, x2, gamma):
    y, _, total = torch_npu.npu_add_rms_norm(x1, x2, gamma)
    h = y.size(-1)
    return y, total, y.view(-1, h).to(torch.float32)


def _cast_eps(x1, x2, gamma):
    y, _, total = torch_npu.npu_add_rms_norm(x1, x2, gamma, 1e-5)
    return y, total, y.to(torch.float32)


@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead"])
@pytest.mark.parametrize("fn", [_cast, _cast_eps])
def test_a_norm_cast_to_float32_becomes_npu_add_rms_norm_cast(npugraph, mode, fn):
    compiled, seen = _compiled(fn, mode)
    args = _inputs()
    got, expected = compiled(*args), fn(*args)
    (targets,) = seen
    assert CAST in targets and NORM not in targets
    assert all(torch.equal(g.cpu(), e.cpu()) and g.dtype == e.dtype for g, e in zip(got, expected))
    assert not npugraph.hazards


def _quant(x1, x2, gamma, smooth):
    y, _, total = torch_npu.npu_add_rms_norm(x1, x2, gamma)
    out, scale = torch_npu.npu_dynamic_quant(y, smooth_scales=smooth)
    return out, total, scale


def _quant_flat(x1, x2, gamma, smooth):
    y, _, total = torch_npu.npu_add_rms_norm(x1, x2, gamma)
    out, scale = torch_npu.npu_dynamic_quant(y.flatten(0, 1))
    return out, scale.view(-1, 1), total


@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead"])
@pytest.mark.parametrize("fn", [_quant, _quant_flat])
def test_a_norm_then_dynamic_quant_becomes_npu_add_rms_norm_dynamic_quant(npugraph, mode, fn):
    compiled, seen = _compiled(fn, mode)
    x1, x2, gamma = _inputs((2, 3, 16))
    smooth = torch.ones(16, dtype=torch.float16).npu()
    got, expected = compiled(x1, x2, gamma, smooth), fn(x1, x2, gamma, smooth)
    (targets,) = seen
    assert QUANT in targets and NORM not in targets
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        assert torch.allclose(g.cpu().float(), e.cpu().float(), atol=1, rtol=1e-2)   # int8 may differ by one step
    assert not npugraph.hazards


def test_with_the_option_off_nothing_is_fused(npugraph):
    compiled, seen = _compiled(_cast, fusion=False)
    compiled(*_inputs())
    (targets,) = seen
    assert NORM in targets and CAST not in targets


def test_a_chain_split_over_streams_is_not_fused(npugraph):
    def split(x1, x2, gamma, smooth):
        y, _, total = torch_npu.npu_add_rms_norm(x1, x2, gamma)
        with torchair.scope.npu_stream_switch("side"):
            out, scale = torch_npu.npu_dynamic_quant(y, smooth_scales=smooth)
        return out, total, scale

    compiled, seen = _compiled(split)
    x1, x2, gamma = _inputs((2, 3, 16))
    compiled(x1, x2, gamma, torch.ones(16, dtype=torch.float16).npu())
    (targets,) = seen
    assert NORM in targets and QUANT not in targets


def test_a_view_that_changes_the_last_dim_is_not_fused(npugraph):
    def other_view(x1, x2, gamma):
        y, _, total = torch_npu.npu_add_rms_norm(x1, x2, gamma)
        return y, total, y.view(-1, 4).to(torch.float32)

    compiled, seen = _compiled(other_view)
    got = compiled(*_inputs())
    (targets,) = seen
    assert NORM in targets and CAST not in targets
    assert got[2].shape == (4, 4)
