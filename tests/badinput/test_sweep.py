"""Every public emulated callable, called with wrong types and values: the error (if any) is raised
deliberately at the boundary, never from deep inside pytest-npugraph, and the test's analyses still
run cleanly afterwards (a bad argument must not reach the trace and crash an analysis at test end)."""
import threading

import pytest
import torch
import torch_npu  # noqa: F401
import torchair  # noqa: F401

from .sweep import BAD_VALUES, calls, internal_error, public_callables

CALLABLES = public_callables()
# calls that would legitimately block or spawn work outside the test's control
SKIP = {"torch_npu.distributed.ProcessGroupHCCL"}


def test_the_sweep_covers_the_public_surface():
    names = [n for n, _ in CALLABLES]
    assert len(names) > 80
    for expected in ("torch.npu.set_stream_limit", "torch.npu.set_device_limit", "torch.npu.Event",
                     "torch.npu.Stream", "torch.npu.ExternalStream", "torchair.get_npu_backend",
                     "torchair.scope.limit_core_num", "torchair.ops.npu_tagged_event_record"):
        assert expected in names


@pytest.mark.parametrize("name, fn", CALLABLES, ids=[n for n, _ in CALLABLES])
def test_bad_arguments_fail_at_the_boundary(npugraph, name, fn):
    if name in SKIP:
        pytest.skip("spawns a process group")
    problems = []
    for bad in BAD_VALUES:
        for args, kwargs in calls(fn, bad):
            try:
                result = fn(*args, **kwargs)
                if hasattr(result, "__enter__") and hasattr(result, "__exit__") and not isinstance(result, torch.Tensor):
                    with result:
                        pass
            except BaseException as exc:      # noqa: BLE001 - judged below
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                found = internal_error(exc)
                if found:
                    problems.append(f"{name}(*{args!r}, **{kwargs!r}): {found}")
    assert threading.active_count() < 50
    npugraph.assert_clean()       # raises the analysis error if a bad value reached the trace
    assert not problems, "\n".join(problems)
