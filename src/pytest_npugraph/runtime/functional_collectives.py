"""torch's functional collectives (``torch.ops._c10d_functional``) on NPU tensors, handlers of the dispatch core.

Why: ``torch.compile`` turns ``dist.all_reduce(t)`` & co. into the functional collectives
(``all_reduce`` + ``wait_tensor``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``, ...), and
``torch.distributed._functional_collectives`` calls them eagerly.  Their C++ kernels (Functional.cpp)
are the device-generic composition this module repeats with NPU tensors: an out-of-place result
(``all_reduce`` clones its input, contiguous; the gathers and scatters allocate the output on the
input's device), then the process group's in-place collective on it, then the Work registered for
the result, which ``wait_tensor`` unregisters and waits on.  The process group is the one torch's
group name resolves to in the calling rank thread (``_resolve_process_group``): the emulated HCCL
group, which records one collective kernel per rank on its current stream, keyed (group, seq), as
for the eager collectives.  Fake tensors (tracing) take the common path: the ops' meta kernels.
Without this the ops would run on the CPU payloads and hand the process group CPU tensors.
"""
from __future__ import annotations

import threading

import torch

from .tensor import NpuTensor, _is_fake, _run, register_op_handler

_works = threading.local()     # result -> Work: c10d's work registry, per rank thread


def _registry():
    """Weak in the results, as c10d's registry: a result never waited on holds no NPU memory."""
    table = getattr(_works, "table", None)
    if table is None:
        from torch.utils.weak import WeakIdKeyDictionary

        table = _works.table = WeakIdKeyDictionary()
    return table


def _register(results, work) -> None:
    table = _registry()
    for t in results:
        table[t] = work


def _group(name):
    """The process group of torch's group name (or the group itself: ``compile_on_one_rank``)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    return name if isinstance(name, dist.ProcessGroup) else _resolve_process_group(name)


def _reduce_op(name: str):
    """Functional.cpp's ``to_reduce_op``: the string names torch accepts."""
    import torch.distributed as dist

    ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
           "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND,
           "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}
    if name not in ops:
        raise RuntimeError(f"Unrecognized reduce_op: {name}")
    return ops[name]


# --------------------------------------------------------------- in place, on results
def _all_reduce_(tensors, reduce_op: str, group_name):
    import torch.distributed as dist

    opts = dist.AllreduceOptions()
    opts.reduceOp = _reduce_op(reduce_op)
    pg = _group(group_name)
    work = None
    for t in tensors:
        work = pg.allreduce([t], opts)
    _register(tensors, work)
    return tensors


def _all_gather_out(inputs, outputs, group_size: int, group_name):
    pg = _group(group_name)
    for i, o in zip(inputs, outputs):
        work = pg._allgather_base(o, i)
        _register([o], work)
    return outputs


def _reduce_scatter_out(inputs, outputs, reduce_op: str, group_name):
    import torch.distributed as dist

    opts = dist.ReduceScatterOptions()
    opts.reduceOp = _reduce_op(reduce_op)
    pg = _group(group_name)
    for i, o in zip(inputs, outputs):
        work = pg._reduce_scatter_base(o, i, opts)
        _register([o], work)
    return outputs


def _broadcast_(t, src: int, group_name):
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = src
    opts.rootTensor = 0
    work = _group(group_name).broadcast([t], opts)
    _register([t], work)
    return t


# --------------------------------------------------------------- the ops (Functional.cpp)
def _contiguous_clone(t):
    return torch.ops.aten.clone.default(t, memory_format=torch.contiguous_format)


def _gathered(t, group_size: int):
    shape = list(t.shape)
    shape[0] *= group_size
    return torch.empty(shape, dtype=t.dtype, device=t.device)


def _scattered(t, group_size: int):
    if t.size(0) % group_size:
        raise RuntimeError(f"reduce_scatter_tensor: the input's dim 0 ({t.size(0)}) must be divisible by the "
                           f"group size ({group_size})")
    shape = list(t.shape)
    shape[0] //= group_size
    return torch.empty(shape, dtype=t.dtype, device=t.device)


def _all_reduce(a):
    return _all_reduce_([_contiguous_clone(a[0])], a[1], a[2])[0]


def _all_reduce_coalesced(a):
    return _all_reduce_([_contiguous_clone(t) for t in a[0]], a[1], a[2])


def _all_gather(a):
    x = a[0].contiguous()
    return _all_gather_out([x], [_gathered(x, a[1])], a[1], a[2])[0]


def _all_gather_coalesced(a):
    xs = [t.contiguous() for t in a[0]]
    return _all_gather_out(xs, [_gathered(x, a[1]) for x in xs], a[1], a[2])


def _all_gather_into_out(a, kwargs):
    return _all_gather_out([a[0]], [kwargs["out"] if "out" in kwargs else a[3]], a[1], a[2])[0]


def _reduce_scatter(a):
    x = a[0].contiguous()
    return _reduce_scatter_out([x], [_scattered(x, a[2])], a[1], a[3])[0]


def _reduce_scatter_coalesced(a):
    xs = [t.contiguous() for t in a[0]]
    return _reduce_scatter_out(xs, [_scattered(x, a[2]) for x in xs], a[1], a[3])


def _reduce_scatter_into_out(a, kwargs):
    return _reduce_scatter_out([a[0]], [kwargs["out"] if "out" in kwargs else a[4]], a[1], a[3])[0]


def _all_to_all_single(a):
    x, output_split_sizes, input_split_sizes, group_name = a[0].contiguous(), list(a[1]), list(a[2]), a[3]
    shape = list(x.shape)
    if output_split_sizes:
        shape[0] = sum(int(s) for s in output_split_sizes)
    out = torch.empty(shape, dtype=x.dtype, device=x.device)
    work = _group(group_name).alltoall_base(out, x, [int(s) for s in output_split_sizes],
                                            [int(s) for s in input_split_sizes])
    _register([out], work)
    return out


def _wait_tensor(a):
    """Unregister the Work of ``a[0]`` and wait on it (the current stream waits for the collective);
    a tensor with no Work registered is returned as it is, as torch does."""
    work = _registry().pop(a[0], None)
    if work is not None:
        work.wait()
    return a[0]


def _async_collective_tensor(a):
    """``_wrap_tensor_autograd`` (eager functional collectives under autograd): its Python kernel."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    return AsyncCollectiveTensor(a[0])


_OPS = {
    "all_reduce": _all_reduce,
    "all_reduce_": lambda a: _all_reduce_([a[0]], a[1], a[2])[0],
    "all_reduce_coalesced": _all_reduce_coalesced,
    "all_reduce_coalesced_": lambda a: _all_reduce_(list(a[0]), a[1], a[2]),
    "all_gather_into_tensor": _all_gather,
    "all_gather_into_tensor_coalesced": _all_gather_coalesced,
    "reduce_scatter_tensor": _reduce_scatter,
    "reduce_scatter_tensor_coalesced": _reduce_scatter_coalesced,
    "all_to_all_single": _all_to_all_single,
    "broadcast": lambda a: _broadcast_(_contiguous_clone(a[0]), a[1], a[2]),
    "broadcast_": lambda a: _broadcast_(a[0], a[1], a[2]),
    "wait_tensor": _wait_tensor,
    "_wrap_tensor_autograd": _async_collective_tensor,
}
_OUT_OPS = {"all_gather_into_tensor_out": _all_gather_into_out, "reduce_scatter_tensor_out": _reduce_scatter_into_out}


def _tensors(value):
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return [value] if isinstance(value, torch.Tensor) else []


def _functional(func, plan, args, kwargs):
    """The handler of ``_c10d_functional::*``: real NPU tensors go to the process group; fake ones
    (tracing) and ops not named here take the common path."""
    name = func._schema.name.split("::", 1)[1]
    tensors = _tensors(list(args) + list(kwargs.values()))
    real = tensors and all(type(t) is NpuTensor and not _is_fake(t._payload) for t in tensors)
    if not real:
        return _run(func, plan, args, kwargs)
    if name in _OUT_OPS:
        return _OUT_OPS[name](args, kwargs)
    if name in _OPS:
        return _OPS[name](args)
    raise NotImplementedError(
        f"pytest-npugraph: torch.ops._c10d_functional.{name} on NPU tensors is not emulated (the emulated HCCL "
        f"group takes all_reduce, all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, broadcast "
        f"and their coalesced/out forms); call the torch.distributed collective eagerly instead")


def install() -> None:
    register_op_handler("_c10d_functional::*", _functional)
