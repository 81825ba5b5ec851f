"""Processes a test starts emulate its NPU (issue 28): a ``sys.executable`` subprocess or a
``multiprocessing`` child imports the emulated ``torch_npu`` with the test's chip, devices and cores, its
trace joins the test's, and the environment that carries this is the test's only; a test that waits for
children which ended with an error is ended, not left hanging.

Why: vLLM inspects models in ``python -m ...`` subprocesses, launchers start one process per rank: under
the plugin a child that saw no ``torch_npu`` (or a real one, or the default machine) would test nothing.
"""
import multiprocessing
import os
import queue
import subprocess
import sys
import textwrap
import time

import pytest

from pytest_npugraph import child_watch, inherit

CHILD = textwrap.dedent("""
    import torch, torch_npu
    from pytest_npugraph._context import CONTEXT
    p = torch.npu.get_device_properties(0)
    print(torch.npu.device_count(), p.name, p.cube_core_num, p.vector_core_num, CONTEXT.config.cann)
    side = torch.npu.Stream()
    x = torch.ones(8).npu()
    x.mul_(2)                              # the child's main stream writes x
    with torch.npu.stream(side):
        y = x + 1                          # its side stream reads x, unordered
    torch.npu.synchronize()
""")


@pytest.mark.npu_devices(3)
@pytest.mark.npu_chip("Ascend910B3")
@pytest.mark.npu_cores(aicore=8, vector=12)
@pytest.mark.npu_cann("9.0.0")
def test_a_subprocess_emulates_the_tests_npu_and_its_race_is_the_tests(npugraph, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    with npugraph.expect("race", match=r"child\.py:\d+"):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "Ascend910B3", "8", "12", "9.0.0"]


def _forked_child(path):
    import torch
    import torch_npu  # noqa: F401

    with open(path, "w") as f:
        f.write(str((torch.npu.device_count(), (torch.ones(2).npu() * 3).cpu().tolist())))


@pytest.mark.skipif(sys.platform != "linux", reason="fork")
@pytest.mark.npu_devices(2)
def test_a_forked_child_records_into_a_fresh_trace_that_joins_the_tests(npugraph, tmp_path):
    before = len(npugraph.trace)
    proc = multiprocessing.get_context("fork").Process(target=_forked_child, args=(str(tmp_path / "out"),))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    assert (tmp_path / "out").read_text() == "(2, [3.0, 3.0])"
    added = npugraph.trace.records[before:]
    assert [r.op for r in added if type(r).__name__ == "Kernel" and r.op.startswith("aten::mul")] == ["aten::mul.Tensor"]
    npugraph.assert_clean()


@pytest.mark.npu_no_inherit
def test_npu_no_inherit_leaves_children_alone(npugraph):
    assert inherit.ENV not in os.environ
    done = subprocess.run([sys.executable, "-c", "import torch_npu"], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr


def test_the_environment_is_the_tests_only(pytester):
    outer = (os.environ.get(inherit.ENV), os.environ.get("PYTHONPATH"))
    assert outer[0] and outer[1].split(os.pathsep)[0] == inherit.BOOTSTRAP
    pytester.makepyfile(textwrap.dedent("""
        import os
        def test_inner():
            assert os.environ["NPUGRAPH_CHILD"] != %r
            assert '"device_count": 1' in os.environ["NPUGRAPH_CHILD_CONFIG"]
        def test_after():
            pass
    """ % outer[0]))
    pytester.runpytest("-p", "no:randomly").assert_outcomes(passed=2)
    assert (os.environ.get(inherit.ENV), os.environ.get("PYTHONPATH")) == outer
    assert inherit.CONFIG_ENV in os.environ


def _rank(rank, c2p, busy):
    """torch_npu's test pattern: each rank puts its result for the test; rank 0 raises first."""
    if rank == 0:
        raise RuntimeError("rank 0 fails before it puts")
    end = time.monotonic() + busy
    while time.monotonic() < end:              # working (CPU), not waiting
        pass
    c2p.put(rank)
    time.sleep(600)                            # then waits for the test, which never answers


def _start_ranks(busy=0.0):
    ctx = multiprocessing.get_context("spawn")
    c2p = ctx.Queue(2)
    ranks = [ctx.Process(target=_rank, args=(r, c2p, busy)) for r in range(2)]
    for p in ranks:
        p.start()
    return c2p, ranks


@pytest.fixture
def short_grace(monkeypatch):
    monkeypatch.setattr(child_watch, "GRACE", 3.0)


@pytest.mark.skipif(sys.platform != "linux", reason="/proc")
def test_a_wait_for_ranks_that_ended_with_an_error_is_ended_not_waited_on(short_grace):
    c2p, ranks = _start_ranks()
    with pytest.raises(child_watch.ChildrenEnded, match=r"waits in multiprocessing \(connection.py:_recv, called "
                       r"from test_children.py:\d+\).* pid \d+ ended with exit code 1 .*the others \(\d+\) wait "
                       r"without working and were ended: nothing can arrive"):
        for _ in ranks:
            c2p.get()                          # rank 1's result, then rank 0's, which never comes
    for p in ranks:
        p.join(60)
    assert [p.exitcode for p in ranks] == [1, -9]


@pytest.mark.skipif(sys.platform != "linux", reason="/proc")
def test_a_wait_for_a_working_rank_or_with_a_timeout_is_left_alone(short_grace):
    c2p, ranks = _start_ranks(busy=8.0)        # rank 0 failed, rank 1 works longer than the grace
    assert c2p.get() == 1
    with pytest.raises(queue.Empty):           # a wait with a timeout ends by itself
        c2p.get(timeout=6)
    ranks[1].kill()
    for p in ranks:
        p.join(60)
    assert ranks[0].exitcode == 1




@pytest.mark.skipif(sys.platform != "linux", reason="/proc")
def test_processes_a_failed_test_leaves_waiting_are_ended(pytester):
    """torch_npu's pattern: the test's assertion fails before it answers the ranks; left waiting, the
    interpreter's exit (which joins them) would hang the run."""
    pytester.makepyfile(textwrap.dedent("""
        import multiprocessing
        from test_children_helpers import _rank_waiting_for_the_test

        def test_fails_before_answering():
            ctx = multiprocessing.get_context("spawn")
            c2p, p2c = ctx.Queue(2), ctx.Queue(2)
            ranks = [ctx.Process(target=_rank_waiting_for_the_test, args=(r, c2p, p2c)) for r in range(2)]
            for p in ranks:
                p.start()
            assert sorted(c2p.get() for _ in ranks) == [0, 2]     # wrong: the ranks are 0 and 1
    """))
    pytester.makepyfile(test_children_helpers=textwrap.dedent("""
        def _rank_waiting_for_the_test(rank, c2p, p2c):
            c2p.put(rank)
            p2c.get()
    """))
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", timeout=600)
    result.assert_outcomes(failed=1)
    assert "left 2 process(es) waiting" in result.stderr.str() + result.stdout.str()


@pytest.mark.skipif(sys.platform != "linux", reason="/proc")
def test_one_watcher_thread_serves_every_test(monkeypatch):
    """A thread started and joined around every test's body cost more than the rest of the watch: the
    first watch starts the watcher, and it stays to serve the next ones (looking only while one is open)."""
    import threading

    def watchers():
        return [t for t in threading.enumerate() if t.name == "npugraph-child-watch"]

    # this test's body runs inside the plugin's own watch: set it aside while fresh ones open and close
    monkeypatch.setattr(child_watch.ChildWatch, "usable", lambda self: True)
    outer, child_watch._open = child_watch._open, None
    try:
        seen = []
        for _ in range(3):
            with child_watch.ChildWatch() as watch:
                assert child_watch._open is watch
                seen.append(child_watch._watcher)
            assert child_watch._open is None
    finally:
        child_watch._open = outer
    assert seen[0] is not None and seen[0] is seen[1] is seen[2] and seen[0].is_alive()
    assert watchers() == [seen[0]]
