"""output-overwrite: a graph call's output read after a later replay wrote over it (docs/reference.md "Hazards",
issue 6; torchair_api.md §4.7-4.8; anchors.md §2.2).  Catches it in reduce-overhead (same key,
another key of the FX graph, fed to another graph, through a view) and for eager NPU graphs
(``make_graphed_callables``); silent with output clone, in GE mode, when consumed before the next
call, and in the vLLM-Ascend style of ``torch.npu.graph`` into a shared pool."""
import torch
import torch_npu

from graph.helpers import compile_with, config, reduce_overhead

from pytest_npugraph.analysis import analyze


def hazards(npugraph):
    return analyze(npugraph.trace, kinds=["output-overwrite"])


def test_output_kept_across_a_replay_of_the_same_key_names_the_three_lines(npugraph):
    step = reduce_overhead(lambda x: x * 2)
    kept = step(torch.ones(4, device="npu"))           # line A: producing call
    step(torch.full((4,), 3.0, device="npu"))          # line B: overwriting call
    with npugraph.expect("output-overwrite"):
        assert kept.cpu().tolist() == [6.0] * 4        # line C: stale read sees call B's values
    (h,) = hazards(npugraph)
    first = test_output_kept_across_a_replay_of_the_same_key_names_the_three_lines.__code__.co_firstlineno
    a, b, c = (f"tests/replay/test_output_overwrite.py:{first + n}" for n in (2, 3, 5))
    assert h.where == [a, b, c]
    assert f"returned by the call at {a}" in h.message and f"read at {c}" in h.message
    assert f"after the call at {b}" in h.message
    assert "enable_output_clone" in h.message and ".clone()" in h.message and "before the next call" in h.message


def test_output_of_another_key_of_the_same_fx_graph(npugraph):
    step = compile_with(lambda x: x + 1, config("reduce-overhead"), dynamic=True)
    small = step(torch.ones(4, device="npu"))
    step(torch.ones(6, device="npu"))                  # key 2 captured from the pool's empty state
    with npugraph.expect("output-overwrite", match=r"lambda@\S+:\d+\[\[4\]\].*replay 2 of lambda@\S+:\d+\[\[6\]\]"):
        small.sum().item()


def test_stale_output_fed_to_another_graph(npugraph):
    first = reduce_overhead(lambda x: x * 2)
    second = reduce_overhead(lambda x: x + 1)
    kept = first(torch.ones(4, device="npu"))
    first(torch.zeros(4, device="npu"))
    with npugraph.expect("output-overwrite"):
        out = second(kept)                             # copied into the second graph's input: stale
    assert out.cpu().tolist() == [1.0] * 4             # the second call's zeros, not 2s


def test_a_view_of_the_stale_output_is_stale_too(npugraph):
    step = reduce_overhead(lambda x: x * 2)
    row = step(torch.ones(2, 3, device="npu"))[0]
    step(torch.zeros(2, 3, device="npu"))
    with npugraph.expect("output-overwrite"):
        row.cpu()


def test_eager_npu_graph_callable_output_kept_across_calls(npugraph):
    model = torch.nn.Linear(4, 4).npu().requires_grad_(False)
    graphed = torch_npu.npu.make_graphed_callables(model, (torch.ones(2, 4, device="npu"),))
    kept = graphed(torch.ones(2, 4, device="npu"))
    graphed(torch.zeros(2, 4, device="npu"))
    with npugraph.expect("output-overwrite", match="a replayed graph writes its outputs"):
        torch.cat([kept, kept]).cpu()
    (h,) = hazards(npugraph)
    assert "enable_output_clone" not in h.message     # not a compiled graph: clone or consume


# ----------------------------------------------------------------------------- silent
def test_output_clone_keeps_each_call(npugraph):
    step = reduce_overhead(lambda x: x * 2, enable_output_clone=True)
    kept = [step(torch.full((4,), float(i), device="npu")) for i in range(3)]
    assert [k.cpu().tolist() for k in kept] == [[2.0 * i] * 4 for i in range(3)]
    npugraph.assert_clean()


def test_manual_clone_of_the_kept_output(npugraph):
    step = reduce_overhead(lambda x: x * 2)
    kept = [step(torch.full((4,), float(i), device="npu")).clone() for i in range(3)]
    assert [k.cpu().tolist() for k in kept] == [[2.0 * i] * 4 for i in range(3)]
    npugraph.assert_clean()


def test_consumed_before_the_next_call(npugraph):
    step = reduce_overhead(lambda x: x * 2)
    firsts = []
    for i in range(3):
        out = step(torch.full((4,), float(i), device="npu"))
        firsts.append(out[0].item())                   # consumed (host read) before the next replay
        out.add_(1)                                     # the user's own in-place use of the fresh output
    assert firsts == [0.0, 2.0, 4.0]
    npugraph.assert_clean()


def test_ge_mode_outputs_are_fresh_tensors(npugraph):
    step = compile_with(lambda x: x * 2, config("max-autotune"))
    kept = [step(torch.full((4,), float(i), device="npu")) for i in range(3)]
    assert [k.cpu().tolist() for k in kept] == [[2.0 * i] * 4 for i in range(3)]
    npugraph.assert_clean()


def test_latest_output_read_after_older_ones_were_dropped(npugraph):
    step = compile_with(lambda x: x + 1, config("reduce-overhead"), dynamic=True)
    step(torch.ones(4, device="npu"))
    latest = step(torch.ones(6, device="npu"))
    assert latest.cpu().tolist() == [2.0] * 6
    npugraph.assert_clean()


def test_vllm_ascend_style_shared_pool_replay_after_synchronize(npugraph):
    """Graphs per batch size captured with ``torch.npu.graph`` into one shared pool, replayed after a
    synchronize, each output consumed (sampled to the host) before the next replay."""
    weight = torch.randn(8, 8).npu()
    pool = torch.npu.graph_pool_handle()
    graphs, static_in, static_out = {}, {}, {}
    capture_stream = torch.npu.Stream()
    for bs in (4, 2):                                  # vLLM captures the largest batch first
        static_in[bs] = torch.zeros(bs, 8, device="npu")
        graphs[bs] = torch.npu.NPUGraph()
        with torch.npu.graph(graphs[bs], pool=pool, stream=capture_stream):
            static_out[bs] = (static_in[bs] @ weight).relu()
    torch.npu.synchronize()
    tokens = []
    for bs in (2, 4, 2):
        static_in[bs].copy_(torch.ones(bs, 8, device="npu"))
        graphs[bs].replay()
        tokens.append(static_out[bs].argmax(-1).cpu())   # sampled before the next replay
    assert [t.shape[0] for t in tokens] == [2, 4, 2]
    npugraph.assert_clean()


def capture_two_into_one_pool():
    """Graph A's output is dropped after its capture, so graph B (same pool) gets its memory."""
    pool = torch.npu.graph_pool_handle()
    x = torch.ones(4, device="npu")
    ga, gb = torch.npu.NPUGraph(), torch.npu.NPUGraph()
    with torch.npu.graph(ga, pool=pool):
        ya = x * 2
    address = ya.data_ptr()
    del ya
    with torch.npu.graph(gb, pool=pool):
        yb = x + 5
    assert yb.data_ptr() == address                    # B's output lives where A writes its own
    return ga, gb, yb


def test_raw_graphs_sharing_a_pool_replayed_out_of_capture_order(npugraph):
    ga, gb, yb = capture_two_into_one_pool()
    gb.replay()
    ga.replay()                                        # writes A's (dead) output over yb
    with npugraph.expect("output-overwrite", match=r"after a replay of .* wrote over it"):
        yb.cpu()
    (h,) = hazards(npugraph)
    assert "replay in the order they were captured" in h.message and "separate pools" in h.message
    assert h.ops[0] == "aten::mul.Tensor"


def test_raw_graphs_sharing_a_pool_replayed_in_capture_order_are_silent(npugraph):
    ga, gb, yb = capture_two_into_one_pool()
    ga.replay()
    gb.replay()                                        # B rewrites its output after A
    assert yb.cpu().tolist() == [6.0] * 4
    npugraph.assert_clean()


def test_raw_graph_output_consumed_before_the_other_graph_replays_is_silent(npugraph):
    ga, gb, yb = capture_two_into_one_pool()
    gb.replay()
    assert yb.cpu().tolist() == [6.0] * 4              # consumed
    ga.replay()
    npugraph.assert_clean()
