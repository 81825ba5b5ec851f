"""TorchAir's user-visible surface (issue 25): one TorchAir implementation shared by npugraph_ex,
``cache_compile`` (torchair and npugraph_ex) with torchair's checks, and the rest of the public API
upstream TorchAir tests rely on."""
import logging
import os
import pytest
import torch
import torch_npu  # noqa: F401
import torchair
from torchair.configs.compiler_config import CompilerConfig


# ------------------------------------------------------------ one implementation (npugraph_ex re-exports)
def test_npugraph_ex_option_values_are_torchairs_but_read_bools_as_bools():
    from npugraph_ex.configs import _option_base as ex
    from torchair.configs import _option_base as air

    for name in ("IntRangeValue", "IntListValue", "DictOptionValue", "CallableValue", "MustExistedPathValue",
                 "NpuBaseConfig"):
        assert getattr(ex, name) is getattr(air, name), name
    assert issubclass(ex.OptionValue, air.OptionValue)
    assert ex.OptionValue(True, [True, False]).value is True
    assert air.OptionValue(True, [True, False]).value == "1"


def test_npugraph_ex_errors_compiler_and_ops_come_from_torchair():
    import npugraph_ex
    from npugraph_ex._utils import error_code
    from npugraph_ex import npu_fx_compiler
    import torchair.npu_fx_compiler

    assert error_code.pretty_error_msg is torchair._utils.error_code.pretty_error_msg
    assert npu_fx_compiler._NpuFxCompiler is torchair.npu_fx_compiler._NpuFxCompiler
    compiler = npugraph_ex.get_compiler()
    assert compiler.settings.backend == "npugraph_ex" and compiler.settings.mode == "npugraph_ex"


def test_npugraph_ex_logger_is_torchairs_logger_under_its_own_name_and_prefix():
    import npugraph_ex

    assert npugraph_ex.logger.name == "npugraph_ex"
    assert npugraph_ex.logger.level == logging.ERROR       # as the real one, unless TORCH_COMPILE_DEBUG=1
    record = logging.LogRecord("npugraph_ex", logging.ERROR, "f.py", 1, "hello", None, None)
    assert npugraph_ex.logger.handlers[0].format(record).startswith("[ERROR] NPUGRAPH_EX(")
    assert torchair.logger.handlers[0].format(record).startswith("[ERROR] TORCHAIR(")


def test_npugraph_ex_record_tagged_stream_records_on_the_tagged_stream(npugraph):
    """npugraph_ex's op records the tensor on the stream of its tag, as torchair's does (it raised)."""
    import npugraph_ex  # noqa: F401

    x = torch.ones(4, device="npu")
    torch.ops.npugraph_ex.record_tagged_stream(x, "side")
    torch.ops.air.record_tagged_stream(x, "side")


# ------------------------------------------------------------------------------ cache_compile
class _NotAModule:
    def method(self, x):
        return x


class _Model(torch.nn.Module):
    def forward(self, x):
        return x * 2 + 1


def test_cache_compile_compiles_a_module_method():
    model = _Model()
    fn = torchair.inference.cache_compile(model.forward, config=CompilerConfig(), dynamic=False)
    x = torch.arange(4.0, device="npu")
    assert torch.equal(fn(x).cpu(), x.cpu() * 2 + 1)


def test_cache_compile_checks_its_arguments_as_torchair():
    model = _Model()
    with pytest.raises(ValueError, match="Only method can be cached now, got"):
        torchair.inference.cache_compile(lambda x: x)
    with pytest.raises(ValueError, match="Only torch.nn.Module method can be cached now"):
        torchair.inference.cache_compile(_NotAModule().method)
    a, b = CompilerConfig(), CompilerConfig()
    b.mode = "reduce-overhead"
    with pytest.raises(ValueError, match="config in current backend is different from the config during cache "
                                         "generation."):
        torchair.inference.cache_compile(model.forward, config=a, backend=torchair.get_npu_backend(compiler_config=b))
    # a backend alone gives its config
    fn = torchair.inference.cache_compile(model.forward, backend=torchair.get_npu_backend(compiler_config=a),
                                          dynamic=False)
    assert torch.equal(fn(torch.ones(2, device="npu")).cpu(), torch.full((2,), 3.0))


def test_npugraph_ex_cache_compile_compiles_with_npugraph_ex():
    import npugraph_ex

    model = _Model()
    fn = npugraph_ex.inference.cache_compile(model.forward, dynamic=False)
    x = torch.arange(3.0, device="npu")
    assert torch.equal(fn(x).cpu(), x.cpu() * 2 + 1)
    fn = torch.npu.npugraph_ex.inference.cache_compile(model.forward, dynamic=False, options={"clone_input": False})
    assert torch.equal(fn(x).cpu(), x.cpu() * 2 + 1)
    with pytest.raises(ValueError, match="Invalid option 'nope'"):
        torch.npu.npugraph_ex.inference.cache_compile(model.forward, options={"nope": 1})
    with pytest.raises(ValueError, match="Only method can be cached now"):
        npugraph_ex.inference.cache_compile(lambda x: x)


# ------------------------------------------------------------------------------ npu_print
def _printed(capsys):
    return [line.strip() for line in capsys.readouterr().out.split("\n") if line.strip()]


def _print_three(v):
    torchair.ops.npu_print("x =", v, summarize_size=1)
    v = torch.abs(v)
    torchair.ops.npu_print("abs(x) =", v, summarize_size=1)
    v = torch.add(v, 1)
    torchair.ops.npu_print("add(abs(x), 1) =", v, summarize_size=1)
    return v


_THREE = ["x = [[-1 ... -1]", "...", "[-1 ... -1]]", "abs(x) = [[1 ... 1]", "...", "[1 ... 1]]",
          "add(abs(x), 1) = [[2 ... 2]", "...", "[2 ... 2]]"]


@pytest.mark.parametrize("mode", ["eager", "aot_eager", "max-autotune"])
def test_npu_print_prints_in_torchairs_format_each_time_the_graph_runs(capsys, mode):
    t = torch.neg(torch.ones(10, 10, dtype=torch.bfloat16, device="npu"))
    fn = _print_three
    if mode == "aot_eager":
        fn = torch.compile(_print_three, backend="aot_eager")
    elif mode == "max-autotune":
        fn = torch.compile(_print_three, backend=torchair.get_npu_backend(compiler_config=CompilerConfig()))
    out = fn(t)
    assert _printed(capsys) == _THREE
    assert torch.equal(out.cpu(), torch.full((10, 10), 2.0, dtype=torch.bfloat16))
    fn(t)
    assert _printed(capsys) == _THREE


def _captured(mode, fn):
    if mode == "npugraph_ex":
        return torch.compile(fn, backend="npugraph_ex")
    config = CompilerConfig()
    config.mode = "reduce-overhead"
    return torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=config))


@pytest.mark.parametrize("mode", ["reduce-overhead", "npugraph_ex"])
def test_npu_print_in_a_captured_graph_prints_each_replay_with_its_values(capsys, mode):
    """aclgraph replays the captured tasks: the print is a step of the graph, so every run (the first
    is capture + replay) prints that run's values once, never the capture's buffers."""
    fn = _captured(mode, lambda v: (torchair.ops.npu_print("v =", v * 2, summarize_size=-1), v + 1)[1])
    for start in (5.0, 7.0, 9.0):
        t = torch.arange(start, start + 2, device="npu")
        assert torch.equal(fn(t).cpu(), torch.tensor([start + 1, start + 2]))
        assert _printed(capsys) == [f"v = [{2 * start:.0f} {2 * start + 2:.0f}]"]


def test_npu_print_in_a_captured_graph_prints_in_stream_order(capsys):
    def func(v):
        torchair.ops.npu_print(v, summarize_size=-1)
        w = v * 10
        torchair.ops.npu_print(w, summarize_size=-1)
        return w

    fn = _captured("reduce-overhead", func)
    fn(torch.arange(2.0, device="npu"))
    assert _printed(capsys) == ["[0 1]", "[0 10]"]
    fn(torch.arange(3.0, 5.0, device="npu"))
    assert _printed(capsys) == ["[3 4]", "[30 40]"]


@pytest.mark.parametrize("value, size, detail, expected", [
    (torch.tensor(2.5), -1, False, "2.5"),
    (torch.tensor(3), -1, False, "3"),
    (torch.tensor(True), -1, False, "1"),
    (torch.tensor([True, False]), -1, False, "[1 0]"),
    (torch.tensor([1 / 3, 2.0]), -1, False, "[0.333333343 2]"),
    (torch.arange(7), 2, False, "[0 1 ... 5 6]"),
    (torch.tensor(2.5), -1, True, "tensor(2.5, shape=[], dtype=torch.float32)"),
    (torch.tensor([True, False]), -1, True, "tensor([1 0], shape=[2], dtype=torch.bool)"),
    (torch.ones(0, 3, dtype=torch.int32), -1, True, "tensor([], shape=[0, 3], dtype=torch.int32)"),
])
def test_npu_print_values(capsys, value, size, detail, expected):
    torchair.ops.npu_print(value.to("npu"), summarize_size=size, tensor_detail=detail)
    assert _printed(capsys) == [expected]


def test_npu_print_inplace_after_print_in_a_graph(capsys):
    def func(v):
        torchair.ops.npu_print(v, summarize_size=-1)
        v.add_(1)
        torchair.ops.npu_print(v, summarize_size=-1)
        return v

    torch.compile(func, backend=torchair.get_npu_backend())(torch.arange(2, dtype=torch.bfloat16, device="npu"))
    assert _printed(capsys) == ["[0 1]", "[1 2]"]


def test_npu_print_checks_its_arguments():
    x = torch.ones(2, 2, device="npu")
    with pytest.raises(ValueError, match=r"summarize_size must be positive or -1 for all elements, got 0"):
        torchair.ops.npu_print("x =", x, summarize_size=0)
    with pytest.raises(ValueError):
        torchair.ops.npu_print("x =", x, summarize_size=-2)
    with pytest.raises(TypeError, match="summarize_size must be int, got float"):
        torchair.ops.npu_print("x =", x, summarize_size=3.2)
    with pytest.raises(TypeError, match="tensor_detail must be bool, got int"):
        torchair.ops.npu_print(x, tensor_detail=1)
    with pytest.raises(ValueError, match=r"npu_print\(\) requires at least one tensor input"):
        torchair.ops.npu_print("x")
    with pytest.raises(TypeError, match="but got 'list' at position 1"):
        torchair.ops.npu_print(x, [1])


# ------------------------------------------------------------------------------ GE ops.wait
def test_ge_wait_on_tensors_runs_and_orders_the_stream(npugraph):
    """``torchair.ops.wait([tensor])`` in GE mode crashed ("'NpuTensor' object has no attribute 'wait'")."""
    def f(x):
        with torchair.scope.npu_stream_switch("side"):
            a = x * 2
        torchair.ops.wait([a])
        return a + 1

    compiled = torch.compile(f, backend=torchair.get_npu_backend(), fullgraph=True)
    x = torch.ones(3, device="npu")
    assert torch.equal(compiled(x).cpu(), torch.full((3,), 3.0))
    assert torch.equal(compiled(x + 1).cpu(), torch.full((3,), 5.0))


@pytest.mark.parametrize("wait", [True, False])
def test_ge_wait_on_a_tensor_list_orders_later_work_with_no_data_edge(npugraph, wait):
    """``torchair.ops.wait([a, b])`` in GE mode: the ops after it on the stream start after the listed
    tensors' producers on other streams, though they read none of them; without it GE may overlap them."""
    from pytest_npugraph.analysis.happens_before import HappensBefore

    def f(x, y):
        with torchair.scope.npu_stream_switch("side"):
            a = x * 2
            b = x - 1
        if wait:
            torchair.ops.wait([a, b])
        return a, b, y + 1

    compiled = torch.compile(f, backend=torchair.get_npu_backend(), fullgraph=True)
    a, b, c = compiled(torch.ones(3, device="npu"), torch.ones(3, device="npu"))
    assert [t.cpu().tolist() for t in (a, b, c)] == [[2.0] * 3, [0.0] * 3, [2.0] * 3]
    ran = {k.op.split("::")[1].split(".")[0]: k for k in npugraph.trace.records
           if getattr(k, "op", "").startswith(("aten::mul", "aten::sub", "aten::add"))}
    hb = HappensBefore(npugraph.trace)
    assert hb.ordered(ran["mul"].seq, ran["add"].seq) is wait
    assert hb.ordered(ran["sub"].seq, ran["add"].seq) is wait


# ------------------------------------------------------------------------------ graph dump
def _two_streams(x):
    with torchair.scope.npu_stream_switch("s1"):
        y = torch.mm(x, x)
    return y + 1


@pytest.mark.parametrize("kind", ["txt", "pbtxt", "py"])
def test_graph_dump_makes_its_folder_and_shows_nodes_and_streams(tmp_path, kind):
    config = CompilerConfig()
    config.debug.graph_dump.type = kind
    config.debug.graph_dump.path = str(tmp_path / "not" / "yet")     # upstream makes the folder
    compiled = torch.compile(_two_streams, backend=torchair.get_npu_backend(compiler_config=config), fullgraph=True)
    x = torch.ones(2, 2, device="npu")
    assert torch.equal(compiled(x).cpu(), torch.full((2, 2), 3.0))
    (dumped,) = (tmp_path / "not" / "yet").glob(f"dynamo_original_graph_1_rank_0_pid_{os.getpid()}_ts_*.{kind}")
    text = dumped.read_text()
    if kind == "py":
        assert "mm (aten.mm.default): stream s1" in text and "add (aten.add.Tensor): stream main" in text
        assert "def forward(" in text
    elif kind == "txt":
        assert ('op {\n  name: "mm"\n  type: "aten.mm.default"\n  input: "arg0_1:0"\n  attr { key: '
                '"_user_stream_label" value { s: "s1" } }\n  output_desc { tensor: "float32[2, 2]" }\n}') in text
        assert ('name: "add"\n  type: "aten.add.Tensor"\n  input: "mm:0"\n  attr { key: "_user_stream_label" '
                'value { s: "main" } }') in text
    else:
        assert 'node {\n  name: "mm"\n  op: "aten.mm.default"\n  input: "arg0_1"\n' in text
        assert 'attr { key: "stream" value { s: "s1" } }' in text
        assert 'attr { key: "_output_shapes" value { s: "float32[2, 2]" } }' in text


def test_aclgraph_graph_dump_py_makes_its_folder(tmp_path):
    config = CompilerConfig()
    config.mode = "reduce-overhead"
    config.debug.graph_dump.type = "py"
    config.debug.graph_dump.path = str(tmp_path / "new")
    compiled = torch.compile(lambda x: x * 2, backend=torchair.get_npu_backend(compiler_config=config))
    compiled(torch.ones(2, device="npu"))
    names = sorted(p.name.split("_rank_")[0] for p in (tmp_path / "new").iterdir())
    assert names == ["dynamo_optimized_graph_1", "dynamo_original_graph_1"]


# ------------------------------------------------------------------------------ data dump
class _AddSub(torch.nn.Module):
    def forward(self, data0, data1):
        add_01 = torch.add(data0, data1)
        with torchair.scope.data_dump():
            sub_01 = torch.sub(data0, data1)
        mul_01 = torch.mul(data0, data1)
        return add_01, sub_01, mul_01


def test_ge_data_dump_writes_ges_layout_for_the_selected_ops(tmp_path):
    config = CompilerConfig()
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(tmp_path)
    config.dump_config.dump_layer = " Add "
    config.dump_config.dump_mode = "output"
    model = torch.compile(_AddSub(), backend=torchair.get_npu_backend(compiler_config=config))
    a, b = torch.randn(2, 2).npu(), torch.randn(2, 2).npu()
    model(a, b)
    model(a, b)
    (stamp,) = (tmp_path / "worldsize1_global_rank0").iterdir()
    runs = sorted(p.name for p in (stamp / "0" / "graph_1" / "1").iterdir())
    assert runs == ["0", "1"]                                  # one folder per iteration
    files = sorted(p.name.split(".")[:2] for p in (stamp / "0" / "graph_1" / "1" / "0").iterdir())
    assert files == [["Add", "Add"], ["Sub", "Sub"]]           # dump_layer's op and the data_dump scope's
    (add,) = (stamp / "0" / "graph_1" / "1" / "1").glob("Add.Add.*")
    dumped = torch.load(add)
    assert list(dumped) == ["output"] and torch.equal(dumped["output"][0], a.cpu() + b.cpu())


def test_ge_data_dump_step_selects_iterations(tmp_path):
    config = CompilerConfig()
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(tmp_path)
    config.dump_config.dump_step = "1"
    model = torch.compile(lambda x: x + 1, backend=torchair.get_npu_backend(compiler_config=config))
    for _ in range(3):
        model(torch.ones(2, device="npu"))
    (stamp,) = (tmp_path / "worldsize1_global_rank0").iterdir()
    assert [p.name for p in (stamp / "0" / "graph_1" / "1").iterdir()] == ["1"]


@pytest.mark.parametrize("stage", ["optimized", "original"])
def test_aclgraph_data_dump_saves_every_tensor_node_each_run(tmp_path, stage):
    class Network(torch.nn.Module):
        def forward(self, data0, data1):
            mm_01 = torch.mm(data0, data1)
            torch_npu.save_npugraph_tensor(mm_01, save_path=str(tmp_path / "user.pt"))
            return mm_01, torch.add(mm_01, 1)

    config = CompilerConfig()
    config.mode = "reduce-overhead"
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(tmp_path)
    config.dump_config.data_dump_stage = stage
    model = torch.compile(Network(), backend=torchair.get_npu_backend(compiler_config=config))
    a, b = torch.ones(2, 2, device="npu"), torch.ones(2, 2, device="npu")
    model(a, b)
    model(a + 1, b)
    names = sorted(p.name for p in (tmp_path / "worldsize1_global_rank0").iterdir())
    # mm is saved by the user's op, not again by the dump
    assert names == ["add_device_0_0.pt", "add_device_0_1.pt", "arg0_1_device_0_0.pt", "arg0_1_device_0_1.pt",
                     "arg1_1_device_0_0.pt", "arg1_1_device_0_1.pt"]
    assert sorted(p.name for p in tmp_path.glob("user*")) == ["user_device_0_0.pt", "user_device_0_1.pt"]
    assert torch.equal(torch.load(tmp_path / "worldsize1_global_rank0" / "add_device_0_1.pt"), torch.full((2, 2), 5.0))
    assert torch.equal(torch.load(tmp_path / "user_device_0_1.pt"), torch.full((2, 2), 4.0))


def test_npugraph_ex_dump_tensor_data(tmp_path):
    compiled = torch.compile(lambda x: x * 2, backend="npugraph_ex",
                             options={"dump_tensor_data": True, "data_dump_dir": str(tmp_path)})
    compiled(torch.ones(2, device="npu"))
    assert sorted(p.name for p in (tmp_path / "worldsize1_global_rank0").iterdir()) == [
        "arg0_1_device_0_0.pt", "mul_device_0_0.pt"]


def test_save_npugraph_tensor_names_its_files_as_torch_npu(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x = torch.arange(4.0, device="npu")
    torch_npu.save_npugraph_tensor(x, save_path="a.pt")
    torch_npu.save_npugraph_tensor(x, save_path="a.pt")
    torch_npu.save_npugraph_tensor(x.cpu(), save_path="c")
    torch_npu.save_npugraph_tensor(x, save_path="o.bin", overwrite=True)
    torch.ops.npu.save_npugraph_tensor.tensor_list([x, x + 1], save_path="l.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_device_0_0.pt", "a_device_0_1.pt", "c_0.pt",
                                                           "l_device_0_0.pt", "o_device_0.bin"]
    assert torch.equal(torch.load("l_device_0_0.pt")[1], torch.arange(4.0) + 1)
    with pytest.raises(ValueError, match="save_path must include a file name"):
        torch_npu.save_npugraph_tensor(x, save_path="dir/")


# ------------------------------------------------------------------------------ dynamo_export
class _Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x, y):
        return self.lin(x) + y


def test_dynamo_export_writes_the_export_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = _Lin().npu()
    x, y = torch.randn(2, 2).npu(), torch.randn(2, 2).npu()
    config = CompilerConfig()
    assert torchair.dynamo_export(x, y, model=model, export_path="test_export_file_path", config=config) is None
    folder = tmp_path / "test_export_file_path"
    assert sorted(p.name for p in folder.iterdir()) == ["dynamo.pbtxt", "export.air", "options.json"]
    src = (folder / "dynamo.pbtxt").read_text()
    assert src.count('op: "Data"') == 2 and src.count('op: "Const"') == 2      # inputs; weight and bias
    assert src.count('op: "Shape"') == 0 and src.count('op: "NetOutput"') == 1
    assert 'op: "aten.addmm.default"' in src
    assert (folder / "export.air").read_bytes().startswith(b"pytest-npugraph placeholder for a GE .air model")
    assert set(__import__("json").loads((folder / "options.json").read_text())) == {"compile options",
                                                                                   "execute options"}
    # as TorchAir: the config is switched to export mode, and the model was not run
    assert config.export.export_mode is True and config.export.export_name == "export"


def test_dynamo_export_dynamic_has_shape_inputs(tmp_path):
    class Scale(torch.nn.Module):
        def forward(self, x):
            return x * x.size(0)

    torchair.dynamo_export(torch.ones(5).npu(), model=Scale(), export_path=str(tmp_path), export_name="m",
                           dynamic=True)
    src = (tmp_path / "dynamo.pbtxt").read_text()
    assert src.count('op: "Shape"') == 1 and src.count('op: "Data"') == 1
    assert (tmp_path / "m.air").exists()


# ------------------------------------------------------------------------------ alias identity
def test_npu_views_alias_their_base_as_cpu_views_do():
    for device in ("cpu", "npu"):
        x = torch.arange(6.0, device=device)
        v = x[1:]
        assert torch._C._is_alias_of(v, x) and torch._C._is_alias_of(x, v)
        assert not torch._C._is_alias_of(x.clone(), x)
        assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert v.storage_offset() == 1
        assert x.is_set_to(x) and not v.is_set_to(x)
    assert not torch._C._is_alias_of(torch.arange(2.0, device="npu"), torch.arange(2.0))


@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead", "npugraph_ex"])
def test_compiled_view_of_an_input_is_an_alias_of_it(mode):
    if mode == "npugraph_ex":
        backend = "npugraph_ex"
    else:
        config = CompilerConfig()
        config.mode = mode
        backend = torchair.get_npu_backend(compiler_config=config)
    model = torch.compile(lambda x: x[1:4, 1:4].transpose(0, 1), backend=backend, dynamic=True)
    x = torch.randn(4, 4, device="npu")
    res = model(x)
    assert torch._C._is_alias_of(res, x)
    assert (res.size(), res.stride(), res.storage_offset()) == (torch.Size([3, 3]), (1, 4), 5)
    assert torch.equal(res.cpu(), x.cpu()[1:4, 1:4].t())


# ------------------------------------------------------------------------------ mixed precision
def test_fp16_activations_into_an_fp32_linear_promote_as_aclnn(npugraph):
    """aclnnMm/aclnnAddmm take operands of different float dtypes and compute in the promoted one
    (CPU torch raises "mat1 and mat2 must have the same dtype")."""
    lin = torch.nn.Linear(4, 2).npu()
    x16 = torch.randn(3, 4, dtype=torch.float16).npu()
    expected = torch.nn.functional.linear(x16.cpu().float(), lin.weight.detach().cpu(), lin.bias.detach().cpu())
    y = lin(x16)
    assert y.dtype == torch.float32 and torch.allclose(y.cpu(), expected)
    assert (x16 @ lin.weight.t()).dtype == torch.float32
    assert torch.bmm(x16[None], lin.weight.t()[None]).dtype == torch.float32
    compiled = torch.compile(lin, backend=torchair.get_npu_backend())
    assert torch.allclose(compiled(x16).cpu(), expected)
    casts = [k for k in npugraph.trace.records if getattr(k, "op", "").startswith("aten::_to_copy")]
    assert casts                                     # the promotion is device work (aclnn's Cast)
    with pytest.raises(RuntimeError):                # integer operands are not promoted
        torch.ones(2, 2, dtype=torch.int32, device="npu") @ torch.ones(2, 2, device="npu")


# ------------------------------------------------------------------------------ torchair.ge, llm_datadist
_CUSTOM = torch.library.Library("pytest_npugraph_custom", "DEF")
_CUSTOM.define("scaled_add(Tensor x, Tensor y, float alpha) -> Tensor")
torch.library.impl(_CUSTOM, "scaled_add", "Meta")(lambda x, y, alpha: torch.empty_like(x))
torch.library.impl(_CUSTOM, "scaled_add", "PrivateUse1")(lambda x, y, alpha: x + alpha * y)
torch.library.impl(_CUSTOM, "scaled_add", "CPU")(lambda x, y, alpha: x + alpha * y)


@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead"])
def test_a_custom_op_with_a_ge_converter_runs_in_a_graph(mode):
    """TorchAir's custom-op recipe: a torch.library op with Meta and NPU kernels and a GE converter
    built with torchair.ge; the emulator keeps the converter and runs the kernel."""
    from torchair import ge

    @torchair.register_fx_node_ge_converter(torch.ops.pytest_npugraph_custom.scaled_add.default)
    def convert(x, y, alpha, meta_outputs=None):
        return ge.custom_op("ScaledAdd", inputs={"x": x, "y": y}, outputs=["z"], attrs={"alpha": ge.attr.Float(alpha)})

    assert torch.ops.pytest_npugraph_custom.scaled_add.default._ge_converter is convert
    config = CompilerConfig()
    config.mode = mode
    compiled = torch.compile(lambda x, y: torch.ops.pytest_npugraph_custom.scaled_add(x, y, 0.5) * 2,
                             backend=torchair.get_npu_backend(compiler_config=config), fullgraph=True)
    x, y = torch.ones(3, device="npu"), torch.full((3,), 4.0, device="npu")
    assert torch.equal(compiled(x, y).cpu(), torch.full((3,), 6.0))


def test_torchair_ge_public_names_and_builders_say_what_is_not_emulated():
    from torchair import ge

    assert sorted(ge.__all__) == sorted(["custom_op", "Const", "Cast", "DataType", "Format", "Tensor", "TensorSpec",
                                         "Clone"])
    assert ge.DataType.DT_FLOAT16 == 1 and ge.DataType.DT_BF16 == 27 and ge.Format.FORMAT_ND.value == 2
    assert ge.attr.ListInt([1, 2]).value == [1, 2]
    with pytest.raises(AssertionError, match="Int attr value must be int"):
        ge.attr.Int(1.5)
    with pytest.raises(NotImplementedError, match="does not build GE graphs"):
        ge.Const(1.0)
    with pytest.raises(NotImplementedError, match=r"torchair.ge.custom_op\('X'\)"):
        ge.custom_op("X")
    # the former paths still import
    from torchair.ge_concrete_graph.fx2ge_converter import declare_supported, register_fx_node_ge_converter  # noqa
    from torchair.ge_concrete_graph.ge_graph import DataType, Tensor, TensorSpec  # noqa: F401
    import torchair.ge_concrete_graph.ge_converter.experimental.hcom_allgather  # noqa: F401


def test_llm_datadist_checks_then_says_it_is_not_emulated():
    from torchair import llm_datadist

    assert llm_datadist.__all__ == ["create_npu_tensors"]
    with pytest.raises(TypeError, match="shape only support"):
        llm_datadist.create_npu_tensors(4, torch.float16, [0])
    with pytest.raises(NotImplementedError, match="does not emulate LLM-DataDist"):
        llm_datadist.create_npu_tensors([2, 2], torch.float16, [0x1000])


# ------------------------------------------------------------------------------ _optimize_fx
@pytest.mark.parametrize("package", ["torchair", "npugraph_ex"])
def test_optimize_fx_is_the_step_a_test_can_wrap(monkeypatch, package):
    """TorchAir's (and npugraph_ex's) smoke tests wrap ``<package>.npu_fx_compiler._optimize_fx`` to look
    at the optimised graph; the backend calls it through the module attribute."""
    import importlib

    compiler_module = importlib.import_module(f"{package}.npu_fx_compiler")
    seen = []
    original = compiler_module._optimize_fx

    def wrapper(gm, config, observer):
        result = original(gm, config, observer)
        seen.append([str(n.target) for n in result.graph.nodes if n.op == "call_function"])
        return result

    monkeypatch.setattr(compiler_module, "_optimize_fx", wrapper)
    torchair._acl_concrete_graph.replace_stream_event.GraphCounter.set_graph_id(-1)
    backend = torchair.get_npu_backend() if package == "torchair" else "npugraph_ex"
    compiled = torch.compile(lambda x: x.view(-1) + 1, backend=backend, fullgraph=True)
    assert torch.equal(compiled(torch.ones(2, 2, device="npu")).cpu(), torch.full((4,), 2.0))
    assert seen == [["aten.reshape.default", "aten.add.Tensor"]]          # view -> reshape already done


# ------------------------------------------------------------------------------ aclgraph logs
@pytest.mark.parametrize("mode, logger", [("reduce-overhead", "torchair"), ("npugraph_ex", "npugraph_ex")])
def test_aclgraph_logs_its_captures_and_recaptures_as_torchair(caplog, mode, logger):
    """TorchAir's DEBUG lines around a capture, on the product's logger, which its tests (and users)
    read: a new key, the pool's state after the capture (blocks in use: the cloned input's buffer and
    the output), a key found with nothing moved, and a recapture when the current stream's core limit
    changed."""
    fn = _captured(mode, lambda v: v + v)
    x = torch.ones(4, device="npu")

    def lines():
        text = [r.getMessage() for r in caplog.records if r.name == logger]
        caplog.clear()
        return "\n".join(text)
    with caplog.at_level(logging.DEBUG, logger=logger):
        fn(x)
        first = lines()
        fn(x)
        second = lines()
        torch.npu.set_stream_limit(torch.npu.current_stream(), 2, 3)
        fn(x)
        third = lines()
    assert "No find captured AclGraph" in first and "and start to capture it." in first
    assert "After capturing fx_graph" in first and "'activate_num': 2" in first
    assert "Find captured AclGraph" in second and "The current AclGraph no needs to be recaptured" in second
    assert "No find captured" not in second
    assert "The current AclGraph needs to be recaptured" in third and "After capturing fx_graph" in third


# ------------------------------------------------------------------------------ replace_stream_event_pass
def test_replace_stream_event_pass_is_callable_from_a_custom_backend():
    """``torchair._acl_concrete_graph.replace_stream_event.replace_stream_event_pass(gm)`` (TorchAir's
    smoke tests call it in their own backend): native streams/events become stream scopes and tagged
    events, written with the ops' packets as TorchAir writes them, and the graph still computes."""
    from torchair._acl_concrete_graph.replace_stream_event import replace_stream_event_pass

    seen = []

    def func(t):
        default_stream = torch.npu.current_stream()
        side = torch.npu.Stream()
        event = torch.npu.Event()
        torch.npu.set_stream(side)
        event.record()
        tmp = torch.add(t, 1)
        torch.npu.set_stream(default_stream)
        event.wait(side)
        return torch.add(tmp, 2)

    def backend(gm, example_inputs):
        gm = replace_stream_event_pass(gm)
        seen.extend(getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    out = torch.compile(func, backend=backend, fullgraph=True)(torch.zeros(3, device="npu"))
    assert torch.equal(out.cpu(), torch.full((3,), 3.0))
    for name in ("scope_enter", "scope_exit", "tagged_event_record", "tagged_event_wait_on_stream"):
        assert seen.count(name) == 1, (name, seen)
    # the set_stream that goes back stays, a scope_exit after it (TorchAir's pass rewrites only the push)
    assert seen.count("set_stream") == 1 and seen[seen.index("set_stream") + 1] == "scope_exit"
    assert "record_event" not in seen and "wait_event" not in seen


def test_npugraph_ex_replace_stream_event_pass_writes_npugraph_ex_scopes():
    """``npugraph_ex._acl_concrete_graph.replace_stream_event`` (npugraph_ex's smoke tests import it):
    torchair's pass, its stream scopes in npugraph_ex's namespace."""
    import npugraph_ex  # noqa: F401
    from npugraph_ex._acl_concrete_graph import replace_stream_event

    replace_stream_event.GraphCounter.set_graph_id(-1)
    targets = []

    def func(t):
        with torch.npu.stream(torch.npu.Stream()):
            r = t + 1
        return r

    def backend(gm, example_inputs):
        gm = replace_stream_event.replace_stream_event_pass(gm)
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    assert torch.compile(func, backend=backend)(torch.zeros(2, device="npu")).cpu().tolist() == [1, 1]
    scoped = [t for t in targets if "scope_" in t]       # the stream nodes stay, as TorchAir leaves them
    assert scoped == ["npugraph_ex.scope_enter", "npugraph_ex.scope_exit"] and targets[-1] == "npugraph_ex.scope_exit"


def test_an_event_stream_record_event_makes_is_tagged_after_the_record_event():
    """``s.record_event()`` with no event: the event the call makes is registered under the tag
    ``<graph_id><record_event node>`` (TorchAir's pass names it after the ``record_event`` call, as its
    smoke test checks), recorded on the side stream with the stream's fields as strings; torch 2.13's
    Dynamo puts the made event's node after the record, which must not take the tag's name."""
    from torchair._acl_concrete_graph.replace_stream_event import replace_stream_event_pass

    recorded = []

    def func(t):
        default_stream = torch.npu.current_stream()
        s1 = torch.npu.Stream()
        torch.npu.set_stream(s1)
        s1.record_event()
        tmp = torch.add(t, 1)
        torch.npu.set_stream(default_stream)
        return torch.add(tmp, 2)

    def backend(gm, example_inputs):
        gm = replace_stream_event_pass(gm)
        recorded.extend(n.args for n in gm.graph.nodes
                        if getattr(n.target, "__name__", "") == "tagged_event_record_on_stream")
        return gm

    out = torch.compile(func, backend=backend, fullgraph=True)(torch.zeros(3, device="npu"))
    assert out.cpu().tolist() == [3.0] * 3
    assert len(recorded) == 1
    tag, stream_id, index, kind, inside = recorded[0]
    assert tag.startswith("graph_") and tag.endswith("_record_event"), tag
    assert all(isinstance(v, str) for v in (stream_id, index, kind)) and index == "0" and inside is True


def test_set_stream_back_down_a_chain_keeps_the_call_and_exits_after_it_as_torchair():
    """Switching back to a stream lower on the stack (here two levels) leaves the ``set_stream`` node in
    place with one ``scope_exit`` per popped stream right after it, the last one made first, as
    TorchAir's pass inserts them; the stream nodes stay.  TorchAir's smoke
    test_stream_event_replace_with_set_stream reads these names and their order (its back-switch takes
    ``torch.npu.current_stream()`` read on s1, which torch 2.13's Dynamo resolves to the entry stream, as
    it tracks only ``with stream`` blocks; here the back-switch names s1)."""
    from torchair._acl_concrete_graph.replace_stream_event import replace_stream_event_pass

    graphs = []

    def func(t):
        default_stream = torch.npu.current_stream()
        s1, s2, s3 = torch.npu.Stream(), torch.npu.Stream(), torch.npu.Stream()
        tmp = torch.add(t, 0)
        torch.npu.set_stream(s1)
        tmp = torch.add(tmp, 1)
        torch.npu.set_stream(s2)
        tmp = torch.add(tmp, 2)
        torch.npu.set_stream(s3)
        tmp = torch.add(tmp, 3)
        torch.npu.set_stream(s1)
        r = torch.add(tmp, 4)
        torch.npu.set_stream(default_stream)
        return r

    def backend(gm, example_inputs):
        gm = replace_stream_event_pass(gm)
        graphs.append([(n.name, getattr(n.target, "__name__", str(n.target))) for n in gm.graph.nodes])
        return gm

    out = torch.compile(func, backend=backend, fullgraph=True, dynamic=False)(torch.zeros(3, device="npu"))
    assert out.cpu().tolist() == [10.0] * 3
    (nodes,) = graphs
    targets = [t for _, t in nodes]
    assert targets.count("scope_enter") == targets.count("scope_exit") == 3
    back = targets.index("set_stream")
    assert nodes[back][0] == "set_stream_3"           # set_stream(s1): pops s3 and s2
    assert nodes[back + 1] == ("scope_exit_1", "scope_exit") and nodes[back + 2] == ("scope_exit", "scope_exit")
    assert nodes[-2] == ("scope_exit_2", "scope_exit")                  # set_stream(default_stream) pops s1
    assert nodes[-3][1] == "set_stream"


@pytest.mark.parametrize("package", ["torchair", "npugraph_ex"])
def test_static_kernel_and_cat_optimization_import_and_say_they_are_not_emulated(package):
    """``<package>._acl_concrete_graph.static_kernel`` / ``cat_optimization`` (torch_npu 2.14 ships both;
    npugraph_ex's smoke tests import ``static_compile`` at their top and save/restore the cat pass in
    setUp): the modules import and are attributes of the package; calling their entry points says what
    the emulator does not do."""
    import importlib

    from pytest_npugraph.errors import NotEmulated

    acl = importlib.import_module(f"{package}._acl_concrete_graph")
    from_import = importlib.import_module(f"{package}._acl_concrete_graph.static_kernel").static_compile
    assert acl.static_kernel.static_compile is from_import
    with pytest.raises(NotEmulated, match="does not emulate CANN's static kernel compilation"):
        acl.static_kernel.static_compile("dir", "chosen")
    with pytest.raises(NotEmulated, match="does not apply TorchAir's remove_cat_ops pass"):
        acl.cat_optimization.optimize_cat_with_out_tensor(None)


@pytest.mark.parametrize("package", ["torchair", "npugraph_ex"])
def test_acl_concrete_graph_is_the_class_of_compiled_aclgraph_graphs(monkeypatch, package):
    """``<package>._acl_concrete_graph.fx2acl_converter.AclConcreteGraph`` (npugraph_ex's smoke tests save
    and wrap its ``__call__`` in setUp): every run of a compiled npugraph_ex graph goes through it."""
    import importlib

    cls = importlib.import_module(f"{package}._acl_concrete_graph.fx2acl_converter").AclConcreteGraph
    runs = []
    original = cls.__call__

    def counted(self, *args):
        runs.append(self.name)
        return original(self, *args)

    monkeypatch.setattr(cls, "__call__", counted)
    compiled = torch.compile(lambda x: x * 3, backend="npugraph_ex")
    for _ in range(2):
        assert compiled(torch.ones(2, device="npu")).cpu().tolist() == [3.0, 3.0]
    assert runs == ["graph_1", "graph_1"]


@pytest.mark.parametrize("force", [True, False])
def test_npugraph_ex_force_recapture_captures_every_run_and_counts_it(force):
    """npugraph_ex's ``force_recapture`` option: each run after the first recaptures the graph ("needs to
    be recaptured", counted in the capture-count line TorchAir logs after each capture); without it the
    second run replays.  The option was accepted and ignored."""
    from npugraph_ex.core.utils import logger as log

    lines = []

    class Lines(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    handler, level = Lines(logging.DEBUG), log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        model = torch.nn.Linear(4, 4).npu()
        compiled = torch.compile(model, backend="npugraph_ex", fullgraph=True, dynamic=False,
                                 options={"force_recapture": force})
        x = torch.randn(2, 4, device="npu")
        first = compiled(x).cpu()
        first_lines, lines[:] = list(lines), []
        second = compiled(x).cpu()
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    expected = model(x).detach().cpu()
    assert torch.allclose(first, expected) and torch.allclose(second, expected)
    assert any("No find captured AclGraph" in line for line in first_lines)
    assert any(line.startswith("For graph graph_1 : the count of captures is 1") and
               line.endswith("and count of recaptures caused by force_recapture is 0") for line in first_lines)
    if force:
        assert any("The current AclGraph needs to be recaptured" in line for line in lines)
        assert any(line.endswith("count of recaptures caused by force_recapture is 1") for line in lines)
    else:
        assert any("The current AclGraph no needs to be recaptured" in line for line in lines)
        assert not any("count of captures" in line for line in lines)
