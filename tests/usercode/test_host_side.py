"""Host-side APIs that need the npu accelerator: generators, pinned memory, DataLoader, inductor,
sparse tensors, and tensors left over from an earlier test."""
import pytest
import torch
import torch_npu  # noqa: F401


def test_npu_generator_is_reproducible(npugraph):
    g = torch.Generator(device="npu")
    assert g.device == torch.device("npu", 0) and isinstance(g, torch.Generator)
    g.manual_seed(7)
    a = torch.randn(4, generator=g, device="npu")
    g.manual_seed(7)
    b = torch.randn(4, generator=g, device="npu")
    assert a.device.type == "npu" and torch.equal(a.cpu(), b.cpu())
    assert torch.rand(3, device="npu", generator=g.manual_seed(1)).shape == (3,)
    assert isinstance(torch.default_generator, torch.Generator)
    assert torch.Generator().device == torch.device("cpu")


def test_pin_memory_then_async_copy(npugraph):
    host = torch.arange(6.0)
    assert not host.is_pinned()
    pinned = host.pin_memory()
    assert pinned.is_pinned() and pinned.pin_memory() is pinned and torch.equal(pinned, host)
    dev = pinned.to("npu", non_blocking=True)
    torch.npu.synchronize()
    assert dev.cpu().tolist() == host.tolist()
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        dev.pin_memory()


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_with_pin_memory(npugraph, workers):
    ds = torch.utils.data.TensorDataset(torch.arange(16.0).reshape(8, 2), torch.arange(8))
    loader = torch.utils.data.DataLoader(ds, batch_size=4, pin_memory=True, num_workers=workers)
    seen = []
    for x, y in loader:
        assert x.is_pinned() and y.is_pinned()
        seen.append((x.npu(non_blocking=True) * 2).cpu())
    assert torch.equal(torch.cat(seen), torch.arange(16.0).reshape(8, 2) * 2)


def test_compile_with_inductor_names_the_backends_that_work(npugraph):
    fn = torch.compile(lambda x: x * 2 + 1)
    with pytest.raises(Exception, match="cannot compile for the emulated NPU.*torchair.get_npu_backend.*aot_eager"):
        fn(torch.ones(3, device="npu"))
    assert fn(torch.ones(3)).tolist() == [3.0, 3.0, 3.0]          # CPU tensors still use inductor


def test_compile_with_aot_eager_works(npugraph):
    fn = torch.compile(lambda x: x * 2 + 1, backend="aot_eager")
    assert fn(torch.ones(3, device="npu")).cpu().tolist() == [3.0, 3.0, 3.0]


def test_to_sparse_on_npu_is_a_clear_error(npugraph):
    with pytest.raises(NotImplementedError, match="sparse_coo tensors are not supported on npu"):
        torch.randn(3, device="npu").to_sparse()


def test_printing_at_a_script_top_level_does_not_crash(npugraph):
    # the user's line is looked up from the bottom of the stack: exec at depth 0 of a fresh frame chain
    import subprocess
    import sys
    code = "import torch, torch_npu; print(torch.ones(2, device='npu'))"
    env_path = __import__("pytest_npugraph.activation", fromlist=["SHIMS"]).SHIMS
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "PYTHONPATH": env_path + ":" + ":".join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert "device='npu:0'" in out.stdout


def test_a_tensor_from_an_earlier_test_with_more_devices_is_a_clear_error(pytester):
    pytester.makepyfile("""
        import pytest, torch, torch_npu
        KEEP = {}

        @pytest.mark.npu_devices(2)
        def test_makes(npugraph):
            KEEP["x"] = torch.ones(2, device="npu:1")

        def test_uses(npugraph):
            KEEP["x"] + 1

        def test_reads(npugraph):
            KEEP["x"].cpu()
    """)
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*npu:1 does not exist in the running test's emulated machine (1 device(s))*"])
    result.stdout.no_fnmatch_line("*IndexError*")
