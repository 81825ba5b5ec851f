"""Keep Dynamo out of the emulator's own Python: ``outside_dynamo(fn)``.

On hardware the NPU's kernels are C++; here the npu backend is Python (``NpuTensor.__torch_dispatch__``
and the PrivateUse1 kernels), called from the dispatcher.  While ``torch.compile`` runs a function
eagerly around a graph break, Dynamo's frame hook is live and would compile those frames as if they
were user code (a ``RecursionError`` when a host read such as ``if y.sum() < 0`` re-enters dispatch).
torch wraps ``TorchDispatchMode.__torch_dispatch__`` in ``torch._dynamo.disable`` for this reason;
this does the same with the C hooks only, so eager code never imports ``torch._dynamo`` (1.5 s).
"""
from __future__ import annotations

import functools

from torch._C._dynamo import eval_frame as _eval_frame

_SKIP = _eval_frame._FrameExecStrategy(_eval_frame._FrameAction.SKIP, _eval_frame._FrameAction.DEFAULT)


def outside_dynamo(fn):
    """``fn`` with Dynamo's frame hook off while it runs (and the wrapper's own frame skipped)."""
    set_eval_frame = _eval_frame.set_eval_frame

    @functools.wraps(fn)
    def run(*args, **kwargs):
        prior = set_eval_frame(None)
        try:
            return fn(*args, **kwargs)
        finally:
            set_eval_frame(prior)

    _eval_frame.set_code_exec_strategy(run.__code__, _SKIP)
    return run
