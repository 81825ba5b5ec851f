"""A compile in each mode imports nothing of Inductor beyond what a plain ``aot_eager`` compile does:
Inductor's passes and code generators cost about 1.3 s of CPU to import, more than the rest of a
small model's first compile (compiler/noop_ops.py).  Run in a fresh interpreter, where nothing else
has imported them."""


def test_compiled_modes_import_no_more_of_inductor_than_aot_eager(pytester):
    pytester.makepyfile("""
        import sys
        import torch
        import torchair

        def inductor_modules():
            return {name for name in sys.modules if name.startswith("torch._inductor")}

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(8, 8)

            def forward(self, x):
                y = self.linear(x)[:, :]            # a full slice and a same-shape view: no-ops to remove
                return torch.relu(y.view(4, 8)) + x

        def backend(mode):
            if mode == "npugraph_ex":
                return "npugraph_ex"
            config = torchair.CompilerConfig()
            config.mode = mode
            return torchair.get_npu_backend(compiler_config=config)

        def test_it():
            block = Block()
            x = torch.randn(4, 8)
            with torch.no_grad():
                expected = block(x)
                torch.compile(block, backend="aot_eager", dynamic=False)(x)
                baseline = inductor_modules()
                assert "torch._inductor.compile_fx" not in baseline     # else this test could not fail
                block.npu()
                for mode in ("max-autotune", "reduce-overhead", "npugraph_ex"):
                    torch._dynamo.reset()
                    got = torch.compile(block, backend=backend(mode), dynamic=False)(x.npu())
                    assert torch.allclose(got.cpu(), expected, atol=1e-6)
                    assert inductor_modules() - baseline == set(), mode
    """)
    pytester.runpytest_subprocess("--npu-emulate=on", "-p", "no:randomly", "-W", "ignore").assert_outcomes(passed=1)
