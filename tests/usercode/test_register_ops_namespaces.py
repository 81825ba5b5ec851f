"""``pytest_npugraph_register_ops`` supplies ops in the user's own namespaces (issue 23 item 7).

Why: vLLM-Ascend calls its C++ extension's ops as ``torch.ops._C_ascend.*``; that extension cannot
load on a CPU machine, so a suite supplies those ops from its conftest.py: schema, CPU math and core
profile, exactly as for ``torch.ops.npu`` ops.  The op must then run eagerly on npu tensors (a task
with the declared profile), trace in compiled regions, and drive the core checks.
"""

CONFTEST = """
    import torch

    def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
        cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
        def rotate(x):
            x1, x2 = x.chunk(2, dim=-1)
            return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return rotate(query), rotate(key)

    def pytest_npugraph_register_ops(registry):
        registry.register(
            "_C_ascend::rotary_embedding",
            "rotary_embedding(Tensor positions, Tensor query, Tensor key, int head_size, Tensor cos_sin_cache, "
            "bool is_neox) -> (Tensor, Tensor)",
            rotary_embedding, cores={"kind": "AIV", "vector": 8})
        registry.register("my_bias_add", "my_bias_add(Tensor x, Tensor b) -> Tensor", lambda x, b: x + b,
                          namespace="_C_ascend", cores={"kind": "ATB", "vector": "all"})
"""

TESTS = """
    import pytest, torch, torch_npu

    def rope_reference(positions, q, cache):
        cos, sin = cache[positions].chunk(2, dim=-1)
        q1, q2 = q.chunk(2, dim=-1)
        return torch.cat([q1 * cos - q2 * sin, q2 * cos + q1 * sin], dim=-1)

    def inputs():
        g = torch.Generator().manual_seed(0)
        positions = torch.tensor([0, 2, 1])
        q, k = torch.randn(3, 8, generator=g), torch.randn(3, 8, generator=g)
        cache = torch.randn(4, 8, generator=g)
        return positions, q, k, cache

    def test_eager_math_and_profile(npugraph):
        positions, q, k, cache = inputs()
        q2, k2 = torch.ops._C_ascend.rotary_embedding(positions.npu(), q.npu(), k.npu(), 8, cache.npu(), True)
        torch.testing.assert_close(q2.cpu(), rope_reference(positions, q, cache))
        torch.testing.assert_close(k2.cpu(), rope_reference(positions, k, cache))
        (kernel,) = [r for r in npugraph.trace.records
                     if type(r).__name__ == "Kernel" and r.op == "_C_ascend::rotary_embedding"]
        assert kernel.cores.kind == "AIV" and kernel.cores.vector == 8
        npugraph.assert_clean()

    def test_the_ops_are_not_torch_npu_ops():
        assert not hasattr(torch.ops.npu, "rotary_embedding")
        with pytest.raises(AttributeError):
            torch_npu.my_bias_add

    @pytest.mark.parametrize("backend", ["eager", "aot_eager", "npugraph_ex"])
    def test_compiled(npugraph, backend):
        f = torch.compile(lambda x, b: torch.ops._C_ascend.my_bias_add(x, b) * 2, backend=backend, dynamic=False)
        for i in range(2):
            out = f(torch.full((2, 3), float(i)).npu(), torch.ones(3).npu())
            assert out.cpu().tolist() == [[2.0 * (i + 1)] * 3] * 2
        npugraph.assert_clean()

    def test_its_profile_drives_the_core_checks(npugraph):
        s = torch.npu.current_stream()
        with npugraph.expect("limit-ineffective", match="my_bias_add"):
            torch.npu.set_stream_limit(s, 8, 16)
            torch.ops._C_ascend.my_bias_add(torch.ones(2, 4).npu(), torch.ones(4).npu())
"""


def test_register_ops_supplies_another_namespaces_ops(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_c_ascend=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=6)


def test_a_namespace_of_the_emulator_or_torch_is_refused(pytester):
    pytester.makeconftest("""
        def pytest_npugraph_register_ops(registry):
            registry.register("aten::my_op", "my_op(Tensor x) -> Tensor", lambda x: x)
    """)
    pytester.makepyfile(test_x="""
        import torch, torch_npu
        def test_x():
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*namespace 'aten' for 'my_op': give your op's own namespace*"])
