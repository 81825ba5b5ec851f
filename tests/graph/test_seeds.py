"""The examples of the seed documents (reference/seeds/001-003), made small, run on the CPU: each
seed's code is kept as written except the sizes (1000 -> 64) and, for seed 003 (a config fragment),
a small model around it."""
import torch

from pytest_npugraph import trace as T

from .helpers import kernels, records, stream_label

N = 64


def test_seed_001_multi_stream_reduce_overhead_with_tagged_events(npugraph, capsys):
    import torch, os  # noqa: F401,E401
    import torch_npu  # noqa: F401
    import torchair as tng
    from torchair.configs.compiler_config import CompilerConfig
    from torchair.core.utils import logger  # noqa: F401

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tagged_event1 = tng.ops.npu_create_tagged_event(tag="66")
            self.tagged_event2 = tng.ops.npu_create_tagged_event(tag="77")

        def forward(self, in1, in2, in3, in4):
            add_result = torch.add(in1, in2)
            tng.ops.npu_tagged_event_record(self.tagged_event1)
            with tng.scope.npu_stream_switch('1'):
                tng.ops.npu_tagged_event_wait(self.tagged_event1)
                mm_result = torch.mm(in3, in4)
                tng.ops.npu_tagged_event_record(self.tagged_event2)
                B = in3 + in4
                tng.ops.npu_record_tagged_stream(B, '1')
            mm1 = torch.mm(in3, in4)
            del B
            C = torch.ones(N, N, dtype=torch.float16, device="npu")
            C.add_(2)
            with tng.scope.npu_stream_switch('2'):
                tng.ops.npu_tagged_event_wait(self.tagged_event2)
                add2 = torch.add(in3, in4)
            return add_result, mm_result, mm1, add2, C
    model = Model()
    config = CompilerConfig()
    config.mode = "reduce-overhead"
    npu_backend = tng.get_npu_backend(compiler_config=config)

    model = torch.compile(model, backend=npu_backend, dynamic=False, fullgraph=True)
    in1 = torch.randn(N, N, dtype=torch.float16).npu()
    in2 = torch.randn(N, N, dtype=torch.float16).npu()
    in3 = torch.randn(N, N, dtype=torch.float16).npu()
    in4 = torch.randn(N, N, dtype=torch.float16).npu()
    result = model(in1, in2, in3, in4)
    print(f"Result:\n{result}\n")

    assert "Result:" in capsys.readouterr().out
    a, b, c, d = (t.cpu() for t in (in1, in2, in3, in4))
    add_result, mm_result, mm1, add2, C = (t.cpu() for t in result)
    torch.testing.assert_close(add_result, a + b)
    torch.testing.assert_close(mm_result, c @ d)
    torch.testing.assert_close(mm1, c @ d)
    torch.testing.assert_close(add2, c + d)
    torch.testing.assert_close(C, torch.full((N, N), 3.0, dtype=torch.float16))
    # the graph: mm on stream '1', add2 on stream '2', the rest on the capture stream
    (record,) = npugraph.graphs
    assert record.mode == "reduce-overhead" and (record.captures, record.replays) == (1, 1)
    assert record.stream_of("aten.mm") == "1" and record.stream_of("aten.ones") is None
    assert [op.stream for op in record.ops if op.name == "add_3"] == ["2"]
    replayed = kernels(npugraph, graph="#replay1")
    streams = {k.op: stream_label(npugraph, k) for k in replayed if k.op != "aten::mm"}
    assert stream_label(npugraph, kernels(npugraph, "aten::mm", graph="#replay1")[0]) != \
        stream_label(npugraph, kernels(npugraph, "aten::mm", graph="#replay1")[1])
    assert len(set(streams.values()) | {stream_label(npugraph, k) for k in replayed}) == 3
    tags = {npugraph.trace.events[r.event].tag for r in records(npugraph, T.EventWait)}
    assert {"66", "77"} <= tags
    npugraph.assert_clean("race", "event-misuse", "missing-record-stream")


def test_seed_002_multi_stream_ge_mode_with_wait_tensor(npugraph, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                     # the seed dumps the graph into the working directory
    import torch, os  # noqa: F401,E401
    import torch_npu  # noqa: F401
    import torchair as tng
    from torchair.configs.compiler_config import CompilerConfig
    from torchair.core.utils import logger
    import logging
    logger.setLevel(logging.DEBUG)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()

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
    model = Model()
    config = CompilerConfig()
    config.debug.graph_dump.type = "pbtxt"
    npu_backend = tng.get_npu_backend(compiler_config=config)

    model = torch.compile(model, backend=npu_backend, dynamic=False, fullgraph=True)
    in1 = torch.randn(N, N, dtype=torch.float16).npu()
    in2 = torch.randn(N, N, dtype=torch.float16).npu()
    in3 = torch.randn(N, N, dtype=torch.float16).npu()
    in4 = torch.randn(N, N, dtype=torch.float16).npu()
    result = model(in1, in2, in3, in4)
    print(f"Result:\n{result}\n")
    logger.setLevel(logging.ERROR)

    a, b, c, d = (t.cpu() for t in (in1, in2, in3, in4))
    torch.testing.assert_close(result[0].cpu(), a + b)
    torch.testing.assert_close(result[1].cpu(), c @ d)
    torch.testing.assert_close(result[2].cpu(), c @ d)
    torch.testing.assert_close(result[3].cpu(), c + d)
    assert list(tmp_path.glob("dynamo_original_graph_*_rank_0_pid_*_ts_*.pbtxt"))
    (record,) = npugraph.graphs
    assert record.mode == "max-autotune"
    assert record.stream_of("aten.mm") == "1" and record.stream_of("aten.add") is None
    assert [op.stream for op in record.ops if op.name == "add_1"] == ["2"]
    # each wait_tensor is a control edge: the op after it waits for the dependency's producer
    mm, mm1 = kernels(npugraph, "aten::mm")
    add, add2 = kernels(npugraph, "aten::add")
    hb = _happens_before(npugraph)
    assert hb.ordered(add.seq, mm.seq) and hb.ordered(mm.seq, add2.seq)
    assert not hb.ordered(mm.seq, mm1.seq) and not hb.ordered(mm1.seq, mm.seq)   # the two mm overlap
    npugraph.assert_clean("race", "event-misuse")


def _happens_before(npugraph):
    from pytest_npugraph.analysis.happens_before import HappensBefore

    return HappensBefore(npugraph.trace)


def test_seed_003_memory_reuse_modes(npugraph):
    import torch_npu, torchair  # noqa: F401,E401

    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    model = Model()
    config = torchair.CompilerConfig()
    # 配置图执行模式
    config.mode = "reduce-overhead"
    # 开启模式一
    config.aclgraph_config.use_custom_pool = torch.npu.graph_pool_handle()
    # 关闭模式二
    config.debug.aclgraph.disable_mempool_reuse_in_same_fx = True
    # 关闭模式三
    config.debug.aclgraph.clone_input = False
    # 主动开启输出内存拷贝
    config.debug.aclgraph.enable_output_clone = True
    npu_backend = torchair.get_npu_backend(compiler_config=config)
    opt_model = torch.compile(model, backend=npu_backend)

    x = torch.randn(N, N).npu()
    first = x.cpu()
    out1 = opt_model(x)
    x2 = torch.randn(N, N).npu()
    out2 = opt_model(x2)
    torch.testing.assert_close(out1.cpu(), torch.relu(first) * 2)     # cloned: not overwritten
    torch.testing.assert_close(out2.cpu(), torch.relu(x2.cpu()) * 2)
    assert out1.data_ptr() != out2.data_ptr()
    # clone_input off: the second input was copied into the first call's tensor, which the graph reads
    torch.testing.assert_close(x.cpu(), x2.cpu())
    (record,) = npugraph.graphs
    assert (record.captures, record.recaptures, record.replays) == (1, 0, 2)
    pool = config.aclgraph_config.use_custom_pool
    (capture,) = [m for m in records(npugraph, T.CaptureBegin) if m.graph.key is not None]   # the compiled graph's, not an NPUGraph's
    assert capture.pool == str(pool)
