"""What each ``torch.distributed`` collective computes, on the CPU payloads of every member's side
(``MATH[op](calls)``, the calls in group-rank order); arguments that disagree raise ``CollectiveError``.
The MC2 ops' math lives with their specs (``OpSpec.mc2_math``) and joins ``MATH`` at install."""
from __future__ import annotations

from typing import Callable

import torch

from .errors import CollectiveError

# -------------------------------------------------------------------------------- math
def _p(t: torch.Tensor) -> torch.Tensor:
    return t._payload


def _agree(calls, what: str, value: Callable) -> None:
    """Raise unless ``value(call)`` is the same on every rank."""
    values = [value(c) for c in calls]
    if any(v != values[0] for v in values[1:]):
        shown = ", ".join(f"rank {c.thread}: {v}" for c, v in zip(calls, values))
        raise CollectiveError(f"the ranks pass different {what} ({shown})")


def _meta(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), str(t.dtype).replace("torch.", ""))


_LOW = (torch.float16, torch.bfloat16)


def _reduce(tensors: list, op: str) -> torch.Tensor:
    dtype = tensors[0].dtype
    stacked = torch.stack([t.to(torch.float32) if dtype in _LOW else t for t in tensors])
    floating = dtype.is_floating_point or dtype.is_complex
    if op == "sum":
        out = stacked.sum(0, dtype=dtype if not floating else None)
    elif op == "avg":       # HCCL has no AVG: torch_npu sums, then divides the result tensor in place
        if floating:
            out = stacked.mean(0)
        else:               # an integer tensor keeps its dtype: the quotient truncated (Atlas A5 asks for "trunc")
            out = torch.div(stacked.sum(0, dtype=dtype), len(tensors), rounding_mode="trunc")
    elif op == "product":
        out = stacked.prod(0, dtype=dtype if not floating else None)
    elif op == "min":
        out = stacked.amin(0)
    elif op == "max":
        out = stacked.amax(0)
    elif op in ("band", "bor", "bxor"):
        if floating:
            raise CollectiveError(f"ReduceOp.{op.upper()} is not supported for {dtype}")
        combine = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[op]
        out = stacked[0]
        for t in stacked[1:]:
            out = combine(out, t)
    else:
        raise CollectiveError(f"ReduceOp {op} is not supported by the emulated HCCL")
    return out.to(dtype)


def _all_reduce(calls):
    _agree(calls, "reduce ops", lambda c: c.params["reduce"])
    _agree(calls, "tensors", lambda c: [_meta(t) for t in c.outputs])
    for i in range(len(calls[0].outputs)):
        result = _reduce([_p(c.outputs[i]) for c in calls], calls[0].params["reduce"])
        for c in calls:
            _p(c.outputs[i]).copy_(result)


def _reduce_to_root(calls):
    _agree(calls, "reduce ops and roots", lambda c: (c.params["reduce"], c.params["root"]))
    _agree(calls, "tensors", lambda c: [_meta(t) for t in c.outputs])
    root = calls[calls[0].params["root"]]
    for i, out in enumerate(root.outputs):
        _p(out).copy_(_reduce([_p(c.outputs[i]) for c in calls], root.params["reduce"]))


def _broadcast(calls):
    _agree(calls, "roots", lambda c: c.params["root"])
    _agree(calls, "tensors", lambda c: [_meta(t) for t in c.outputs])
    root = calls[calls[0].params["root"]]
    sources = [_p(t).clone() for t in root.outputs]
    for c in calls:
        if c is not root:
            for out, src in zip(c.outputs, sources):
                _p(out).copy_(src)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return _p(t).reshape(-1)


def _all_gather_into_tensor(calls):
    """``output`` = the inputs of ranks 0..W-1 concatenated (flat, as HCCL's buffers)."""
    w = len(calls)
    _agree(calls, "input tensors", lambda c: [_meta(t) for t in c.inputs])
    for c in calls:
        if c.outputs[0].numel() != w * c.inputs[0].numel() or c.outputs[0].dtype != c.inputs[0].dtype:
            raise CollectiveError(f"rank {c.thread}: output {_meta(c.outputs[0])} must hold {w} x input "
                                  f"{_meta(c.inputs[0])}")
    gathered = torch.cat([_flat(c.inputs[0]) for c in calls])
    for c in calls:
        _p(c.outputs[0]).copy_(gathered.view(c.outputs[0].shape))


def _all_gather(calls):
    """List form: ``outputs[i][r]`` receives rank r's ``inputs[i]``."""
    _agree(calls, "input tensors", lambda c: [_meta(t) for t in c.inputs])
    sources = [[_p(t).clone() for t in c.inputs] for c in calls]
    for c in calls:
        for i, outs in enumerate(c.params["output_lists"]):
            if len(outs) != len(calls):
                raise CollectiveError(f"rank {c.thread}: all_gather needs {len(calls)} output tensors, got {len(outs)}")
            for r, out in enumerate(outs):
                _p(out).copy_(sources[r][i].view(out.shape))


def _reduce_scatter_tensor(calls):
    """Rank r's ``output`` = the reduction over ranks of chunk r of their flat inputs."""
    w = len(calls)
    _agree(calls, "reduce ops", lambda c: c.params["reduce"])
    _agree(calls, "input tensors", lambda c: [_meta(t) for t in c.inputs])
    for c in calls:
        if c.inputs[0].numel() != w * c.outputs[0].numel() or c.outputs[0].dtype != c.inputs[0].dtype:
            raise CollectiveError(f"rank {c.thread}: input {_meta(c.inputs[0])} must hold {w} x output "
                                  f"{_meta(c.outputs[0])}")
    chunks = [_flat(c.inputs[0]).chunk(w) for c in calls]
    for r, c in enumerate(calls):
        reduced = _reduce([ch[r] for ch in chunks], c.params["reduce"])
        _p(c.outputs[0]).copy_(reduced.view(c.outputs[0].shape))


def _reduce_scatter(calls):
    """List form: rank r's ``outputs[i]`` = reduction over ranks q of ``input_lists[i][r]``."""
    _agree(calls, "reduce ops", lambda c: c.params["reduce"])
    _agree(calls, "input tensors", lambda c: [[_meta(t) for t in ts] for ts in c.params["input_lists"]])
    for r, c in enumerate(calls):
        for i, out in enumerate(c.outputs):
            parts = [_p(q.params["input_lists"][i][r]) for q in calls]
            _p(out).copy_(_reduce(parts, c.params["reduce"]).view(out.shape))


def _splits(c, which: str, tensor: torch.Tensor, w: int) -> list:
    sizes = list(c.params[which] or [])
    rows = tensor.shape[0] if tensor.dim() else 1
    if not sizes:
        if rows % w:
            raise CollectiveError(f"rank {c.thread}: {rows} rows do not split evenly over {w} ranks; "
                                  f"pass {which}")
        return [rows // w] * w
    if len(sizes) != w or sum(sizes) != rows:
        raise CollectiveError(f"rank {c.thread}: {which} {sizes} must have {w} entries summing to {rows}")
    return sizes


def _offsets(sizes: list) -> list:
    out, total = [], 0
    for s in sizes:
        out.append(total)
        total += s
    return out


def _all_to_all_single(calls):
    """Rank q sends rows [in_off_q[r], +in_split_q[r]) of its input to rank r, which stores
    them at out_off_r[q] (dim 0); rank r's output_split[q] must equal rank q's input_split[r]."""
    w = len(calls)
    _agree(calls, "dtypes and row shapes", lambda c: (c.inputs[0].dtype, tuple(c.inputs[0].shape[1:])))
    ins = [_splits(c, "input_split_sizes", c.inputs[0], w) for c in calls]
    outs = [_splits(c, "output_split_sizes", c.outputs[0], w) for c in calls]
    for q in range(w):
        for r in range(w):
            if ins[q][r] != outs[r][q]:
                raise CollectiveError(f"rank {calls[q].thread} sends {ins[q][r]} rows to rank {calls[r].thread}, "
                                      f"which expects {outs[r][q]} (input_split_sizes/output_split_sizes)")
    sources = [_p(c.inputs[0]).clone() for c in calls]
    for r, c in enumerate(calls):
        dst, out_off = _p(c.outputs[0]), _offsets(outs[r])
        for q in range(w):
            start = _offsets(ins[q])[r]
            dst[out_off[q]:out_off[q] + outs[r][q]].copy_(sources[q][start:start + ins[q][r]])


def _rows(t: torch.Tensor) -> int:
    """Elements per dim-0 row, as HCCL counts them (a tensor with no rows counts 1)."""
    return t.numel() // t.shape[0] if t.dim() and t.shape[0] else 1


def _reduce_scatter_tensor_uneven(calls):
    """ReduceScatterV: rank r's ``output`` = the reduction over ranks of rows [off[r], +sizes[r]) of
    their inputs (``input_split_sizes``, the same on every rank)."""
    _agree(calls, "reduce ops", lambda c: c.params["reduce"])
    _agree(calls, "input tensors", lambda c: [_meta(t) for t in c.inputs])
    _agree(calls, "input_split_sizes", lambda c: c.params["input_split_sizes"])
    sizes, row = calls[0].params["input_split_sizes"], _rows(calls[0].inputs[0])
    offsets = _offsets(sizes)
    for r, c in enumerate(calls):
        if c.outputs[0].numel() != sizes[r] * row:
            raise CollectiveError(f"rank {c.thread}: output {_meta(c.outputs[0])} must hold {sizes[r]} rows of "
                                  f"{row} elements (input_split_sizes {sizes})")
    flats = [_flat(c.inputs[0]) for c in calls]
    for r, c in enumerate(calls):
        start = offsets[r] * row
        reduced = _reduce([f[start:start + sizes[r] * row] for f in flats], c.params["reduce"])
        _p(c.outputs[0]).copy_(reduced.view(c.outputs[0].shape))


def _all_gather_into_tensor_uneven(calls):
    """AllGatherV: rows [off[r], +sizes[r]) of every rank's ``output`` = rank r's input
    (``output_split_sizes``, the same on every rank)."""
    _agree(calls, "output tensors", lambda c: [_meta(t) for t in c.outputs])
    _agree(calls, "output_split_sizes", lambda c: c.params["output_split_sizes"])
    sizes, row = calls[0].params["output_split_sizes"], _rows(calls[0].outputs[0])
    for r, c in enumerate(calls):
        if c.inputs[0].numel() != sizes[r] * row or c.inputs[0].dtype != c.outputs[0].dtype:
            raise CollectiveError(f"rank {c.thread}: input {_meta(c.inputs[0])} must hold {sizes[r]} rows of {row} "
                                  f"elements (output_split_sizes {sizes})")
    gathered = torch.cat([_flat(c.inputs[0]) for c in calls])
    for c in calls:
        _p(c.outputs[0]).copy_(gathered.view(c.outputs[0].shape))


def _all_to_all_vc(calls):
    """AlltoAllVC: ``matrix[i][j]`` elements go from rank i to rank j; rank i's input holds its sends
    per target rank in rank order, rank j's output its receipts per source rank in rank order."""
    w = len(calls)
    _agree(calls, "send_count_matrix", lambda c: c.params["send_count_matrix"])
    _agree(calls, "dtypes", lambda c: (c.inputs[0].dtype, c.outputs[0].dtype))
    flat = calls[0].params["send_count_matrix"]
    if len(flat) != w * w:
        raise CollectiveError(f"send_count_matrix has {len(flat)} entries; a group of {w} needs {w * w}")
    matrix = [flat[i * w:(i + 1) * w] for i in range(w)]
    for i, c in enumerate(calls):
        sends, receives = sum(matrix[i]), sum(row[i] for row in matrix)
        if c.inputs[0].numel() != sends or c.outputs[0].numel() != receives:
            raise CollectiveError(f"rank {c.thread}: input holds {c.inputs[0].numel()} elements and output "
                                  f"{c.outputs[0].numel()}; send_count_matrix has it send {sends} and receive {receives}")
    sources = [_flat(c.inputs[0]).clone() for c in calls]
    for j, c in enumerate(calls):
        received = [sources[i][_offsets(matrix[i])[j]:][:matrix[i][j]] for i in range(w)]
        _p(c.outputs[0]).copy_(torch.cat(received).view(c.outputs[0].shape))


def _all_to_all(calls):
    """List form: rank r's ``outputs[q]`` receives rank q's ``inputs[r]``."""
    w = len(calls)
    for c in calls:
        if len(c.inputs) != w or len(c.outputs) != w:
            raise CollectiveError(f"rank {c.thread}: all_to_all needs {w} input and {w} output tensors")
    sources = [[_p(t).clone() for t in c.inputs] for c in calls]
    for r, c in enumerate(calls):
        for q, out in enumerate(c.outputs):
            if _meta(c.inputs[0])[1] != _meta(out)[1] or out.numel() != sources[q][r].numel():
                raise CollectiveError(f"rank {c.thread}: output {q} {_meta(out)} cannot receive rank "
                                      f"{calls[q].thread}'s input {r} {tuple(sources[q][r].shape)}")
            _p(out).copy_(sources[q][r].view(out.shape))


def _gather(calls):
    _agree(calls, "roots", lambda c: c.params["root"])
    root = calls[calls[0].params["root"]]
    if len(root.outputs) != len(calls):
        raise CollectiveError(f"rank {root.thread} (root): gather needs {len(calls)} output tensors")
    for out, c in zip(root.outputs, calls):
        _p(out).copy_(_p(c.inputs[0]).view(out.shape))


def _scatter(calls):
    _agree(calls, "roots", lambda c: c.params["root"])
    root = calls[calls[0].params["root"]]
    if len(root.inputs) != len(calls):
        raise CollectiveError(f"rank {root.thread} (root): scatter needs {len(calls)} input tensors")
    sources = [_p(t).clone() for t in root.inputs]
    for c, src in zip(calls, sources):
        _p(c.outputs[0]).copy_(src.view(c.outputs[0].shape))


def _barrier(calls):
    return None


def _p2p(calls):
    """A send (group rank 0 of its channel) and the receive that pairs with it: same size and dtype."""
    send, recv = calls
    if send.params["kind"] != "send" or recv.params["kind"] != "recv":
        raise CollectiveError("a point-to-point channel pairs a send with a receive")
    source, target = send.inputs[0], recv.outputs[0]
    if source.numel() != target.numel() or source.dtype != target.dtype:
        raise CollectiveError(f"rank {send.thread} sends {source.numel()} {_meta(source)[1]} elements but rank "
                              f"{recv.thread} receives {target.numel()} {_meta(target)[1]}: HCCL needs the same count "
                              f"and dtype on both sides")
    _p(target).copy_(_p(source).reshape(_p(target).shape))


MATH = {
    "all_reduce": _all_reduce, "reduce": _reduce_to_root, "broadcast": _broadcast,
    "all_gather": _all_gather, "all_gather_into_tensor": _all_gather_into_tensor,
    "reduce_scatter": _reduce_scatter, "reduce_scatter_tensor": _reduce_scatter_tensor,
    "all_to_all": _all_to_all, "all_to_all_single": _all_to_all_single,
    "reduce_scatter_tensor_uneven": _reduce_scatter_tensor_uneven,
    "all_gather_into_tensor_uneven": _all_gather_into_tensor_uneven, "all_to_all_vc": _all_to_all_vc,
    "gather": _gather, "scatter": _scatter, "barrier": _barrier, "p2p": _p2p,
}   # + the MC2 ops' collective math, read off their specs (``OpSpec.mc2_math``) by install()
