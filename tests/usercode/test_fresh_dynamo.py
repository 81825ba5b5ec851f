"""docs/reference.md ("The npugraph fixture"): fresh compiled-graph caches in every test.

Dynamo caches compiled code per code object, across tests; each test's ``get_npu_backend()`` is a new
backend, so without a reset the 9th test compiling the same model class with ``fullgraph=True`` fails
with ``FailOnRecompileLimitHit`` (each passes alone)."""
import pytest

SOAK = """
    import pytest, torch, torch_npu, torchair

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return torch.relu(self.lin(x)) * 2

    @pytest.mark.parametrize("i", range(20))
    def test_compile_same_class(npugraph, i):
        model = Block().npu()
        config = torchair.CompilerConfig()
        if i % 3 == 1:
            config.mode = "reduce-overhead"
        compiled = torch.compile(model, backend=torchair.get_npu_backend(compiler_config=config), fullgraph=True)
        x = torch.randn(4, 8, device="npu")
        torch.testing.assert_close(compiled(x).cpu(), model(x).cpu())
        npugraph.assert_clean()
"""


@pytest.mark.parametrize("order", [["-p", "no:randomly"], ["-p", "randomly", "--randomly-seed=4242"],
                                   ["-p", "no:randomly", "-n", "2"]], ids=["file-order", "random-order", "xdist"])
def test_twenty_tests_compiling_one_model_class_all_pass(pytester, order):
    pytester.makepyfile(test_soak=SOAK)
    result = pytester.runpytest_subprocess(*order)
    result.assert_outcomes(passed=20)
    result.stdout.no_fnmatch_line("*FailOnRecompileLimitHit*")


def test_compiled_code_of_a_test_is_released(pytester):
    """Dynamo's transformed code dies with its cache, and with it the ``__compiled_fn_*`` globals it
    installed in the test module (the emulator must not keep code objects alive)."""
    pytester.makepyfile(test_release="""
        import sys, torch, torch_npu, torchair

        def forward(x):
            return x * 3

        def test_a(npugraph):
            torch.compile(forward, backend=torchair.get_npu_backend())(torch.ones(2, device="npu"))
            assert any(k.startswith("__compiled_fn") for k in globals())

        def test_b(npugraph):
            import gc
            gc.collect()
            assert not [k for k in globals() if k.startswith("__compiled_fn")]
    """)
    pytester.runpytest_subprocess("-p", "no:randomly").assert_outcomes(passed=2)
