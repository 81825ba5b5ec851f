"""torch.npu.NPUGraph / torch.npu.graph / graph_pool_handle (torch_npu_api.md §4): capture records and
does not execute, replay recomputes over the static buffers and puts its tasks in the trace, pools,
side streams joining a capture, and the errors of the real API."""
import json

import pytest
import torch
import torch_npu

from pytest_npugraph import trace as T
from pytest_npugraph.analysis.happens_before import HappensBefore

from .helpers import kernels, records, stream_label


def _capture(fn, *, pool=None, stream=None):
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, pool=pool, stream=stream):
        out = fn()
    return g, out


def test_capture_executes_nothing_and_replay_recomputes_over_static_buffers(npugraph):
    static_in = torch.ones(4, device="npu")
    cache = torch.zeros(4, device="npu")

    def step():
        y = static_in * 2 + 1
        cache.add_(y)
        return y

    g, static_out = _capture(step)
    assert cache.cpu().tolist() == [0.0] * 4           # memory older than the capture is untouched
    g.replay()
    assert cache.cpu().tolist() == [3.0] * 4 and static_out.cpu().tolist() == [3.0] * 4
    static_in.fill_(2)
    ptr = static_out.data_ptr()
    g.replay()
    assert static_out.cpu().tolist() == [5.0] * 4 and cache.cpu().tolist() == [8.0] * 4
    assert static_out.data_ptr() == ptr                # the output lives at a fixed address
    # the trace: shadow tasks between the capture markers, real tasks per replay on the replay stream
    markers = [m for m in records(npugraph, T.Marker) if isinstance(m, (T.CaptureBegin, T.CaptureEnd, T.CaptureAbort))]
    assert [type(m) for m in markers] == [T.CaptureBegin, T.CaptureEnd]
    assert markers[0].stream == markers[1].stream
    shadow = kernels(npugraph, graph="#capture")
    assert [k.op for k in shadow] == ["aten::mul.Tensor", "aten::add.Tensor", "aten::add_.Tensor"]
    assert all(not k.reads and not k.writes and k.cores.vector == 0 for k in shadow)
    assert all(markers[0].seq < k.seq < markers[1].seq for k in shadow)
    for n in (1, 2):
        replay = kernels(npugraph, graph=f"#replay{n}")
        assert [k.op for k in replay] == [k.op for k in shadow]
        assert {stream_label(npugraph, k) for k in replay} == {"npu:0/default"}
        assert replay[1].writes[0].lo == ptr and replay[0].site.line == shadow[0].site.line
    npugraph.assert_clean()


def test_replay_runs_on_the_current_stream(npugraph):
    x = torch.ones(2, device="npu")
    g, out = _capture(lambda: x + 1)
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        g.replay()
    (k,) = kernels(npugraph, graph="#replay1")
    assert k.stream == s._state.sid


def test_side_streams_join_the_capture_through_events(npugraph):
    x = torch.ones(4, device="npu")
    side = torch.npu.Stream()

    def step():
        main = torch.npu.current_stream()
        side.wait_stream(main)                  # the side stream joins the capture
        with torch.npu.stream(side):
            a = x * 2
        b = x + 1
        main.wait_stream(side)                  # and is joined back before it ends
        return a + b

    g, out = _capture(step)
    g.replay()
    assert out.cpu().tolist() == [4.0] * 4
    replay = kernels(npugraph, graph="#replay1")
    assert stream_label(npugraph, replay[0]) == side_label(npugraph, side)
    hb = HappensBefore(npugraph.trace)
    mul, add, add2 = replay
    assert hb.ordered(mul.seq, add2.seq) and not hb.ordered(mul.seq, add.seq)
    npugraph.assert_clean()


def side_label(npugraph, stream):
    return npugraph.trace.streams[stream._state.sid].label


def test_a_side_stream_not_joined_before_capture_end_is_reported(npugraph):
    x = torch.ones(4, device="npu")
    side = torch.npu.Stream()

    def step():
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side):
            return x * 2

    with npugraph.expect("event-misuse", match="must be joined back before the end of capture"):
        _capture(step)


def test_pools_are_private_unless_shared(npugraph):
    h1, h2 = torch.npu.graph_pool_handle(), torch.npu.graph_pool_handle()
    assert h1 != h2 and h1[0] * h1[1] == 0 and h1[0] == 0
    x = torch.ones(4, device="npu")
    g1, _ = _capture(lambda: x + 1)
    g2, _ = _capture(lambda: x + 2, pool=g1.pool())
    g3, _ = _capture(lambda: x + 3)
    assert g2.pool() == g1.pool() != g3.pool() and g1.pool()[1] == 0
    g4, out = _capture(lambda: x * 4, pool=h1)
    assert g4.pool() == h1
    block = npugraph.trace.blocks[out._block.bid]
    assert block.pool == str(h1)


def test_is_current_stream_capturing(npugraph):
    seen = []
    _capture(lambda: seen.append(torch.npu.is_current_stream_capturing()))
    assert seen == [True] and not torch.npu.is_current_stream_capturing()
    assert torch_npu.npu.graphs.is_current_stream_capturing() is False


def test_npugraph_errors_match_torch_npu(npugraph, monkeypatch):
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match=r"^Called NPUGraph::replay without a preceding successful capture\.$"):
        g.replay()
    with pytest.raises(RuntimeError, match=r"^Called NPUGraph::pool\(\) without a preceding successful capture\.$"):
        g.pool()
    with pytest.raises(RuntimeError, match=r"^capture_end\(\) called before capture_begin\(\)\.$"):
        g.capture_end()
    with pytest.raises(RuntimeError, match=r"^NPU graphs must be captured on a non-default stream\. \(However, after "
                                           r"capture, it's ok to replay them on the default stream\.\)$"):
        g.capture_begin()
    with pytest.raises(RuntimeError, match=r"^Unknown capture error mode\. Expected `global`, `thread_local`, or "
                                           r"`relaxed`, got strict$"):
        g.capture_begin(capture_error_mode="strict")
    monkeypatch.setenv("TASK_QUEUE_ENABLE", "2")
    with pytest.raises(RuntimeError, match=r"^Do not support TASK_QUEUE_ENABLE = 2 during NPU graph capture"):
        g.capture_begin()
    monkeypatch.delenv("TASK_QUEUE_ENABLE")
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        g.capture_begin()
    with pytest.raises(RuntimeError, match=r"^Capture must end on the same stream it began on\.$"):
        g.capture_end()
    with torch.npu.stream(s):
        g.capture_end()
    with pytest.raises(RuntimeError, match=r"^This NPUGraph instance already owns a captured graph\. To capture a new "
                                           r"graph, create a new instance\.$"):
        with torch.npu.graph(g):
            pass
    with pytest.raises(RuntimeError) as info:
        g.update([{}])
    assert info.value.args[0] == ("The current graph configuration does not support update,Try to capture by "
                                  "setting auto_dispatch_capture=True during capture")
    with pytest.raises(RuntimeError) as info:
        g.super_kernel_optimize(optimize_options=[1])
    assert info.value.args[0] == "optimize_options param must be dict or None."


def test_debug_dump(npugraph, tmp_path):
    g = torch.npu.NPUGraph()
    with pytest.warns(UserWarning, match="Called NPUGraph::debug_dump without a preceding successful capture."):
        g.debug_dump(str(tmp_path / "g.json"))
    x = torch.ones(2, device="npu")
    with torch.npu.graph(g):
        x + 1
    g.debug_dump(str(tmp_path / "g.json"))
    assert [e["name"] for e in json.loads((tmp_path / "g.json").read_text())] == ["aten::add.Tensor"]
    assert (tmp_path / "g.aligned.json").exists()


def test_update_patches_the_attention_lengths_of_an_auto_dispatch_capture(npugraph):
    q = torch.randn(1, 2, 1, 8).npu()
    k, v = torch.randn(1, 2, 6, 8).npu(), torch.randn(1, 2, 6, 8).npu()

    def attention(lengths):
        return torch_npu.npu_fused_infer_attention_score(q, k, v, num_heads=2, input_layout="BNSD",
                                                         actual_seq_lengths_kv=lengths)[0]

    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, auto_dispatch_capture=True):
        out = attention([6])
    g.replay()
    torch.testing.assert_close(out.cpu(), attention([6]).cpu())
    with pytest.raises(RuntimeError, match="there are 1 operators that need to be updated by capture, and there are "
                                           "only 2 elements"):
        g.update([{}, {}])
    g.update([{"actual_seq_lengths_kv": [3]}])
    g.replay()
    torch.testing.assert_close(out.cpu(), attention([3]).cpu())


def test_update_patches_an_argument_the_schema_takes_positionally(npugraph):
    # _npu_paged_attention's context_lens is a positional argument of its schema: the capture records
    # the call normalised, whatever names the caller used, and update() must still find it by name.
    batch, heads, dim, blocks, block_size = 2, 2, 8, 4, 4
    q = torch.randn(batch, heads, dim, dtype=torch.float16).npu()
    key_cache = torch.randn(blocks, block_size, heads, dim, dtype=torch.float16).npu()
    value_cache = torch.randn(blocks, block_size, heads, dim, dtype=torch.float16).npu()
    block_table = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0]], dtype=torch.int32).npu()

    def attention(lengths, out):
        torch_npu._npu_paged_attention(query=q, key_cache=key_cache, value_cache=value_cache, num_kv_heads=heads,
                                       num_heads=heads, scale_value=0.5, block_table=block_table,
                                       context_lens=torch.tensor(lengths, dtype=torch.int32), out=out)
        return out

    out = torch.zeros(batch, heads, dim, dtype=torch.float16).npu()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, stream=torch.npu.Stream(), auto_dispatch_capture=True):
        attention([2, 3], out)
    g.update(cpu_update_input=[{"context_lens": torch.tensor([7, 5], dtype=torch.int32)}])
    g.replay()
    expected = attention([7, 5], torch.zeros_like(out))
    torch.testing.assert_close(out.cpu(), expected.cpu())
    assert not torch.equal(expected.cpu(), attention([2, 3], torch.zeros_like(out)).cpu())


def test_make_graphed_callables(npugraph):
    model = torch.nn.Linear(4, 4).npu()
    for p in model.parameters():
        p.requires_grad_(False)
    x = torch.randn(2, 4).npu()
    graphed = torch.npu.make_graphed_callables(model, (x,), num_warmup_iters=1)
    y = torch.randn(2, 4).npu()
    torch.testing.assert_close(graphed(y).cpu(), model(y).cpu())
    assert kernels(npugraph, graph="#replay1")
    with pytest.raises(RuntimeError, match="sample_args for each callable must contain only Tensors"):
        torch.npu.make_graphed_callables(model, (1,))


def test_super_kernel_scope_ops_eagerly(npugraph):
    torch.npu.super_kernel_scope_begin("sk")
    torch.npu.super_kernel_scope_end("sk")
    assert [(type(m), m.name) for m in records(npugraph, (T.SuperKernelBegin, T.SuperKernelEnd))] == \
        [(T.SuperKernelBegin, "sk"), (T.SuperKernelEnd, "sk")]
    with pytest.raises(RuntimeError) as info:
        torch.npu.super_kernel_scope_end("")
    assert info.value.args[0] == "scope_name should be None or a non-empty string."


def test_task_group_functions_are_torch_npu_npu_attributes(npugraph):
    # torch_npu.npu exports graph_task_group_begin/end and graph_task_update_begin/end (its __all__)
    stream = torch.npu.Stream()
    torch.npu.graph_task_group_begin(stream)
    handle = torch_npu.npu.graph_task_group_end(stream)
    torch.npu.graph_task_update_begin(stream, handle)
    torch_npu.npu.graph_task_update_end(stream)
    assert [type(m) for m in records(npugraph, (T.TaskGroupBegin, T.TaskGroupEnd, T.TaskUpdateBegin,
                                                T.TaskUpdateEnd))] == \
        [T.TaskGroupBegin, T.TaskGroupEnd, T.TaskUpdateBegin, T.TaskUpdateEnd]


def test_a_capture_draws_no_random_numbers_and_each_replay_draws_on(npugraph):
    # the graph-safe generator: seed, capture, replay gives what the eager op gives after the same seed,
    # and a second replay continues the sequence as a second eager call would
    torch.npu.manual_seed(42)
    first = torch.empty(16, device="npu").uniform_(-1, 1).cpu()
    second = torch.empty(16, device="npu").uniform_(-1, 1).cpu()
    torch.npu.manual_seed(42)
    state = torch.npu.get_rng_state()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        out = torch.empty(16, device="npu").uniform_(-1, 1)
    assert torch.equal(torch.npu.get_rng_state(), state)
    g.replay()
    torch.testing.assert_close(out.cpu(), first, rtol=0, atol=0)
    g.replay()
    torch.testing.assert_close(out.cpu(), second, rtol=0, atol=0)


def test_the_seed_cannot_change_during_a_capture(npugraph):
    message = ("NPUGeneratorImpl::set_current_seed can be called during stream capture only if new seed is the "
               "same as the original seed.")
    torch.npu.manual_seed(1)
    other_seed = torch.npu.get_rng_state()
    torch.npu.manual_seed(0)
    with pytest.raises(RuntimeError, match=message):
        with torch.npu.graph(torch.npu.NPUGraph()):
            torch.npu.manual_seed(1)
    with pytest.raises(RuntimeError, match=message):
        with torch.npu.graph(torch.npu.NPUGraph()):
            torch.npu.set_rng_state(other_seed)
    with torch.npu.graph(torch.npu.NPUGraph()):
        torch.npu.manual_seed(0)                  # the same seed is allowed
    torch.npu.manual_seed(1)                      # and any seed outside a capture


def test_super_kernel_optimize_checks_option_keys_and_types(npugraph):
    g = torch.npu.NPUGraph()
    x = torch.ones(2, device="npu")
    with torch.npu.graph(g):
        x + 1
    g.super_kernel_optimize(optimize_options={"preload_code": 1, "dcci_before_kernel_start": ["k"],
                                              "aggressive_opt_strategies": {"task_breaker_bypass": 1}},
                            debug_options={"debug_extend": "x"})
    for kwargs, message in [
            ({"optimize_options": {"preload": 1}}, "Invalid optimize_options param key: 'preload'."),
            ({"optimize_options": {"split_mode": "1"}}, "optimize_options param['split_mode'] must be int, got str"),
            ({"optimize_options": {"dcci_after_kernel_end": ["a", 2]}},
             "optimize_options['dcci_after_kernel_end'][1] must be str, got int"),
            ({"optimize_options": {"aggressive_opt_strategies": {"bypass": 1}}},
             "Invalid sub_key 'bypass' in optimize_options['aggressive_opt_strategies']."),
            ({"optimize_options": {"aggressive_opt_strategies": {"value_breaker_bypass": 1.0}}},
             "optimize_options['aggressive_opt_strategies']['value_breaker_bypass'] must be int, got float"),
            ({"debug_options": {"debug_sync_all": None}}, "debug_options param['debug_sync_all'] must be int, got NoneType"),
            ({"debug_options": {"preload_code": 1}}, "Invalid debug_options param key: 'preload_code'.")]:
        with pytest.raises(RuntimeError) as info:
            g.super_kernel_optimize(**kwargs)
        assert info.value.args[0] == message
