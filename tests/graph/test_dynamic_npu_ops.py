"""torch_npu ops whose shape rule is their reference math (no explicit meta kernel) in dynamic-shape
graphs: the math runs on the symbolic meta tensors, so the graph compiles once for every size (zeros of
a symbolic shape cannot be made)."""
import pytest
import torch
import torch_npu
import torchair


def _add_rms_norm(x1, x2, gamma):
    y, _, total = torch_npu.npu_add_rms_norm(x1, x2, gamma, 4e-6)
    return y * 2, total


@pytest.mark.parametrize("backend", ["aot_eager", "reduce-overhead", "max-autotune"])
def test_npu_add_rms_norm_in_a_dynamic_graph(backend):
    if backend != "aot_eager":
        config = torchair.CompilerConfig()
        config.mode = backend
        backend = torchair.get_npu_backend(compiler_config=config)
    fn = torch.compile(_add_rms_norm, backend=backend, dynamic=True)
    gamma = torch.randn(16, dtype=torch.float16, device="npu")
    for size in (3, 5):
        x1 = torch.randn(1, size, 16, dtype=torch.float16, device="npu")
        x2 = torch.randn(1, size, 16, dtype=torch.float16, device="npu")
        got, want = fn(x1, x2, gamma), _add_rms_norm(x1, x2, gamma)
        for g, w in zip(got, want):
            assert g.shape == (1, size, 16) and g.dtype == torch.float16
            assert torch.equal(g.cpu(), w.cpu())
