"""GE mode logs the compile options a graph is loaded with when it first runs, as TorchAir's
GeConcreteGraph does (``_normalize_ge_option``): an updated input is written through an output that
reuses its memory (``ge.exec.outputReuseInputMemIndexes``), left out with a reason when the input is a
host tensor.  TorchAir's tests/smoke/ge_test.py reads these lines."""
import logging

import pytest
import torch
import torch_npu  # noqa: F401
import torchair


def _run_logged(caplog, fn, *args, **config_fields):
    config = torchair.CompilerConfig()
    for name, value in config_fields.items():
        obj, _, attr = name.rpartition(".")
        target = config
        for part in filter(None, obj.split(".")):
            target = getattr(target, part)
        setattr(target, attr, value)
    compiled = torch.compile(fn, backend=torchair.get_npu_backend(compiler_config=config))
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="torchair"), torch.no_grad():
        out = compiled(*args)
    return out, [r.getMessage() for r in caplog.records if r.name == "torchair"]


def _option(lines, key):
    found = [line.split(": ", 1)[1] for line in lines if line.startswith(f"  {key}: ")]
    return found[0] if found else None


def _updates_two_inputs(x1, x2, x3):
    add = torch.add(x1, 10, out=x1)
    mul = torch.mul(x2, 10, out=x2)
    return add + mul, x3 * 100


def test_updated_npu_inputs_reuse_their_memory_through_appended_outputs(npugraph, caplog):
    x1, x2, x3 = (torch.ones(2, 3, device="npu") for _ in range(3))
    (s, t), lines = _run_logged(caplog, _updates_two_inputs, x1, x2, x3)
    assert x1.cpu().tolist() == [[11.0] * 3] * 2 and x2.cpu().tolist() == [[10.0] * 3] * 2
    assert s.cpu().tolist() == [[21.0] * 3] * 2 and t.cpu().tolist() == [[100.0] * 3] * 2
    # GE's outputs: the user's two, then one per updated input (x1's sum, x2's product): input,output pairs
    assert _option(lines, "ge.exec.outputReuseInputMemIndexes") == "0,2|1,3"
    assert _option(lines, "ge.exec.outputReuseMemIndexes") == "0,1"
    assert _option(lines, "ge.exec.staticMemoryPolicy") == "2"
    assert _option(lines, "ge.inputHintShape") == "0:[2, 3];1:[2, 3];2:[2, 3]"
    assert lines.index("global compile options:") < lines.index("local compile options:")
    assert not any("Skip outputReuseInputMemIndexes" in line for line in lines)
    assert not npugraph.hazards


def test_an_output_that_returns_the_written_value_is_the_one_reused(npugraph, caplog):
    def f(unused, cache, x):
        cache.add_(x)
        return x * 2, cache

    args = (torch.zeros(2, device="npu"), torch.zeros(2, device="npu"), torch.ones(2, device="npu"))
    out, lines = _run_logged(caplog, f, *args)
    # the unused input is not a GE Data: the cache is input 0; its value is already output 1
    assert _option(lines, "ge.exec.outputReuseInputMemIndexes") == "0,1"
    assert _option(lines, "ge.exec.outputReuseMemIndexes") == "0"
    assert args[1].cpu().tolist() == [1.0, 1.0]


def test_host_inputs_are_not_reused_and_the_log_says_why(npugraph, caplog):
    x1, x2, x3 = (torch.ones(2, 3) for _ in range(3))
    _, lines = _run_logged(caplog, _updates_two_inputs, x1, x2, x3)
    assert "Skip outputReuseInputMemIndexes: reuse pair (output=2, input=0) uses host input." in lines
    assert _option(lines, "ge.exec.outputReuseInputMemIndexes") is None
    assert x1.tolist() == [[11.0] * 3] * 2


def test_a_graph_without_updated_inputs_has_no_reuse_option_and_logs_once(npugraph, caplog):
    config = torchair.CompilerConfig()
    compiled = torch.compile(lambda x: x.sin() + 1, backend=torchair.get_npu_backend(compiler_config=config))
    x = torch.ones(3, device="npu")
    with caplog.at_level(logging.INFO, logger="torchair"):
        compiled(x)
        compiled(x)
    lines = [r.getMessage() for r in caplog.records if r.name == "torchair"]
    assert lines.count("local compile options:") == 1
    assert _option(lines, "ge.exec.outputReuseInputMemIndexes") is None
    assert _option(lines, "ge.exec.outputReuseMemIndexes") == "0"


def test_the_configs_own_ge_options_are_logged(npugraph, caplog):
    x = torch.ones(3, device="npu")
    _, lines = _run_logged(caplog, lambda x: x + 1, x, **{"ge_config.aicore_num": "2|4"})
    assert _option(lines, "ge.aicoreNum") == "2|4"


def test_a_data_dependent_size_is_not_taken_for_an_empty_tensor(npugraph, caplog):
    """An op whose size depends on the data (nonzero) has an unbacked symbolic size: the options are
    logged without guarding on it."""
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        out, lines = _run_logged(caplog, lambda x: torch.nonzero(x > 0.5).sum() + x.sum(),
                                 torch.tensor([0.0, 1.0, 0.7], device="npu"))
    assert out.cpu().item() == pytest.approx(3.0 + 1.7)
    assert _option(lines, "ge.exec.allTensorNotEmpty") == "1"
