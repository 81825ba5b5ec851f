"""docs/reference.md ("The npugraph fixture"), fresh state in every test: each test below first checks that it starts on a fresh
emulated machine (current device and stream, memory, stream limits, tagged events, the allocator,
Dynamo's caches, the emulated modules), then leaves that state changed.  Run in file order and in
reverse order, every test passes both times: nothing one test leaves behind reaches the next."""
import pytest

TESTS = """
    import sys
    import pytest, torch, torch_npu, torchair

    MODULES = {name: sys.modules[name] for name in ("torch_npu", "torchair")}

    def fresh(npugraph):
        assert sys.modules["torch_npu"] is MODULES["torch_npu"] and sys.modules["torchair"] is MODULES["torchair"]
        assert torch.npu.current_device() == 0
        assert torch.npu.current_stream() == torch.npu.default_stream()
        assert torch.npu.memory_allocated() == 0
        s = torch.npu.Stream()
        assert torch.npu.get_stream_limit(s) == {"cube_core_num": npugraph.cube_cores,
                                                 "vector_core_num": npugraph.vector_cores}
        assert npugraph.hazards == [] and npugraph.graphs == [] and len(npugraph.trace) < 50
        assert torch.npu.memory_stats().get("num_ooms", 0) == 0

    @pytest.mark.npu_devices(2)
    def test_leaves_device_1_and_a_side_stream_current(npugraph):
        fresh(npugraph)
        torch.npu.set_device(1)
        torch.npu.set_stream(torch.npu.Stream())

    def test_leaves_memory_allocated_and_an_oom(npugraph):
        fresh(npugraph)
        global KEEP
        KEEP = torch.ones(1024, device="npu")
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(10 ** 14, dtype=torch.uint8, device="npu")

    def test_leaves_a_stream_limit_and_a_device_limit(npugraph):
        fresh(npugraph)
        torch.npu.set_stream_limit(torch.npu.current_stream(), 2, 4)
        torch.npu.set_device_limit(0, 4, 8)

    def test_leaves_a_tagged_event_and_a_captured_graph(npugraph):
        fresh(npugraph)
        event = torchair.ops.npu_create_tagged_event(tag="shared_tag")   # a second one with this tag raises
        def f(x):
            y = x + 1
            torchair.ops.npu_tagged_event_record(event)
            with torchair.scope.npu_stream_switch("1"):
                torchair.ops.npu_tagged_event_wait(event)
                z = y * 2
            return z
        config = torchair.CompilerConfig()
        config.mode = "reduce-overhead"
        compiled = torch.compile(f, backend=torchair.get_npu_backend(compiler_config=config), fullgraph=True)
        x = torch.ones(4, device="npu")
        assert compiled(x).cpu().tolist() == [4.0] * 4
        assert npugraph.graphs

    def shared(x):
        return x.sin() * 2

    def test_leaves_dynamo_caches_of_one_function(npugraph):
        fresh(npugraph)
        from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
        assert _debug_get_cache_entry_list(shared.__code__) == []
        compiled = torch.compile(shared, backend="npugraph_ex", fullgraph=True, dynamic=False)
        for n in range(1, 5):
            compiled(torch.ones(n, 3, device="npu"))
        assert len(_debug_get_cache_entry_list(shared.__code__)) == 4

    def test_leaves_sys_modules_replaced(npugraph):
        fresh(npugraph)
        from unittest import mock
        sys.modules["torch_npu"] = mock.MagicMock()
        sys.modules["torchair"] = mock.MagicMock()
"""

REVERSE = """
    def pytest_collection_modifyitems(items):
        items.reverse()
"""


@pytest.mark.parametrize("order", ["file", "reverse"])
def test_every_test_starts_fresh_in_either_order(pytester, order):
    pytester.makepyfile(test_state=TESTS)
    if order == "reverse":
        pytester.makeconftest(REVERSE)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=6)
    names = [line.split("::")[1].split()[0] for line in result.stdout.lines if "::test_" in line and "PASSED" in line]
    assert names[0] == ("test_leaves_device_1_and_a_side_stream_current" if order == "file"
                        else "test_leaves_sys_modules_replaced")
