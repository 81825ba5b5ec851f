"""Errors for user mistakes name the user's line and the fix, without the plugin's (or torch's) frames
in the traceback (issue 27)."""


def run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:randomly", *args)

GE_TAGGED = """
import torch, torch_npu
import torchair as tng


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ev = tng.ops.npu_create_tagged_event(tag="66")

    def forward(self, a, b):
        c = a + b
        tng.ops.npu_tagged_event_record(self.ev)
        with tng.scope.npu_stream_switch("1"):
            tng.ops.npu_tagged_event_wait(self.ev)
            d = c * 2
        return d


def test_ge():
    model = torch.compile(Model(), backend=tng.get_npu_backend(), fullgraph=True)
    a = torch.randn(4, device="npu")
    model(a, a)
"""


def line_of(source: str, text: str) -> int:
    """The line of ``text`` in the file pytester writes from ``source``."""
    return next(i for i, line in enumerate(source.strip("\n").splitlines(), 1) if text in line)


def test_tagged_events_in_ge_mode_name_the_line_and_the_fix(pytester):
    pytester.makepyfile(test_ge_tagged=GE_TAGGED)
    result = run(pytester, "-q")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    # TorchAir's own message first (the exception type and text mirror the real product) ...
    assert "NotImplementedError: torch.ops.air.tagged_event_record.default ge_converter is not implemented!" in out
    # ... then the user's line and the fix
    assert (f"test_ge_tagged.py:{line_of(GE_TAGGED, 'npu_tagged_event_record(')}: torchair.ops.npu_tagged_event_record (a tagged event) orders streams in "
            "reduce-overhead (aclgraph) mode only") in out
    assert 'Fix: compile with config.mode = "reduce-overhead"' in out
    assert "npu_wait_tensor" in out
    # the traceback is the user's: no frame of the emulated compiler, Dynamo or AOTAutograd
    for internal in ("compiler/ge.py", "compiler/pipeline.py", "_utils/error_code.py", "torch/_dynamo/",
                     "torch/_functorch/"):
        assert internal not in out, internal
    assert f"test_ge_tagged.py:{line_of(GE_TAGGED, 'model(a, a)')}: BackendCompilerFailed" in out


ASSERT_CLEAN = """
import torch, torch_npu

def test_race(npugraph):
    x = torch.ones(4, device="npu")
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        y = x * 2
    z = y + 1
    npugraph.assert_clean()
"""


def test_a_failing_assert_clean_shows_no_plugin_source(pytester):
    pytester.makepyfile(test_clean=ASSERT_CLEAN)
    result = run(pytester, "-q")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert ">       npugraph.assert_clean()" in out
    assert f"test_clean.py:{line_of(ASSERT_CLEAN, 'assert_clean()')}: AssertionError" in out
    assert "fixture.py" not in out and "def assert_clean" not in out and "raise AssertionError" not in out


EXPECT = """
import torch, torch_npu

def test_no_race(npugraph):
    with npugraph.expect("race"):
        torch.ones(4, device="npu") + 1
"""


def test_a_failing_expect_shows_no_plugin_source(pytester):
    pytester.makepyfile(test_expect=EXPECT)
    result = run(pytester, "-q")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "npugraph.expect('race'): the block produced no such hazard" in out
    assert "fixture.py" not in out and "def expect" not in out
