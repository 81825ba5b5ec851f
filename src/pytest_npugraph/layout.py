"""Which bytes a strided view touches, and whether two views share any (exactly).

Why: ``x[:, :4]`` and ``x[:, 4:]`` of a 4x8 tensor, or ``a[0::2]`` and ``a[1::2]``, have
intersecting byte *ranges* but no common element; a checker that compares ranges reports a
race between them that hardware never has.  Granularity is the byte of each element the view
names (a kernel reads and writes the elements of its operands, not whole cache lines or 32-byte
blocks: AscendC moves data with ``DataCopy``/``DataCopyPad`` over the operand's own elements,
and two kernels writing disjoint elements of one buffer is the documented way of splitting
work, e.g. ``npu_scatter_nd_update`` on disjoint rows of a KV cache).

Form.  A view of ``item``-byte elements at byte ``lo`` with ``shape`` and ``strides`` (in
elements) is normalised into ``(run, dims)``: the bytes are
``{lo + sum(i_d * S_d) + r : 0 <= i_d < n_d, 0 <= r < run}`` with ``dims = ((n_d, S_d), ...)``
in byte strides, ascending.  Size-1 and stride-0 (expanded) dimensions add no bytes and are
dropped; a dimension whose stride is at most the current run extends the run (its copies of
the run touch or overlap: one dense interval, which also covers ``unfold``'s overlapping
windows); two dimensions where the outer stride equals count times inner stride become one.
``dims == ()`` is a dense byte interval.

Intersection.  Runs ``p = loA + sum(i S)`` and ``q = loB + sum(j T)`` overlap iff
``p - q`` lies in ``[1 - runA, runB - 1]``: a bounded linear Diophantine question.  Terms with
equal stride are merged (``S*i - S*j = S*k`` with ``k`` in the summed range), which makes the
usual cases (slices of one tensor: same strides) one or two terms; the rest is a depth-first
search over the terms, largest stride first, pruning each coefficient to the interval that can
still reach the window.  The search is exact; when it needs more than ``BUDGET`` nodes the
smaller view is enumerated run by run (each run tested against the other view by the same
search), and only a view with more than ``ENUMERATE`` runs beyond that is assumed to overlap
(conservative; never seen for real tensor views).
"""
from __future__ import annotations

from functools import lru_cache

BUDGET = 4096
ENUMERATE = 1 << 16


@lru_cache(maxsize=4096)
def normalise(item: int, shape, strides) -> tuple:
    """``(run, dims)`` of a view (see the module doc); ``dims == ()`` when the bytes are dense.
    Cached: every op asks it for each tensor it touches, and a test uses few distinct layouts."""
    dims = sorted((abs(s) * item, n) for n, s in zip(shape, strides) if n > 1 and s != 0)
    run = item
    out: list = []
    for stride, n in dims:
        if not out and stride <= run:
            run += (n - 1) * stride
        elif out and out[-1][1] * out[-1][0] == stride:
            count, inner = out[-1]
            out[-1] = (count * n, inner)
        else:
            out.append((n, stride))
    return run, tuple(out)


def extent(run: int, dims: tuple) -> int:
    """Bytes from the first to one past the last byte touched."""
    return run + sum((n - 1) * s for n, s in dims)


def count(dims: tuple) -> int:
    """Number of runs."""
    total = 1
    for n, _ in dims:
        total *= n
    return total


class _Exhausted(Exception):
    pass


def _solvable(terms: list, lo: int, hi: int, budget: list) -> bool:
    """Is there ``v_k`` in ``[l_k, h_k]`` with ``sum(c_k v_k)`` in ``[lo, hi]``?  ``terms`` are
    ``(c, l, h)`` with ``c > 0``, largest ``c`` first."""
    k = len(terms)
    rest_min, rest_max = [0] * (k + 1), [0] * (k + 1)
    for i in range(k - 1, -1, -1):
        c, l, h = terms[i]
        rest_min[i] = rest_min[i + 1] + c * l
        rest_max[i] = rest_max[i + 1] + c * h

    def search(i: int, lo: int, hi: int) -> bool:
        if i == k:
            return lo <= 0 <= hi
        budget[0] -= 1
        if budget[0] < 0:
            raise _Exhausted
        c, l, h = terms[i]
        first = max(l, -((rest_max[i + 1] - lo) // c))        # ceil((lo - rest_max) / c)
        last = min(h, (hi - rest_min[i + 1]) // c)
        if first > last:
            return False
        if i == k - 1:
            return True
        return any(search(i + 1, lo - c * v, hi - c * v) for v in range(first, last + 1))

    return search(0, lo, hi)


def _terms(a_dims: tuple, b_dims: tuple) -> list:
    merged: dict = {}
    for dims, sign in ((a_dims, 1), (b_dims, -1)):
        for n, s in dims:
            l, h = (0, n - 1) if sign > 0 else (1 - n, 0)
            old = merged.get(s)
            merged[s] = (l, h) if old is None else (old[0] + l, old[1] + h)
    return sorted(((s, l, h) for s, (l, h) in merged.items()), reverse=True)


@lru_cache(maxsize=65536)
def intersects(a_lo: int, a_run: int, a_dims: tuple, b_lo: int, b_run: int, b_dims: tuple) -> bool:
    """Whether two normalised views (byte start, run, dims) share a byte."""
    if a_lo >= b_lo + extent(b_run, b_dims) or b_lo >= a_lo + extent(a_run, a_dims):
        return False
    if not a_dims and not b_dims:
        return True
    base = a_lo - b_lo
    try:
        return _solvable(_terms(a_dims, b_dims), 1 - a_run - base, b_run - 1 - base, [BUDGET])
    except _Exhausted:
        pass
    if count(a_dims) > count(b_dims):
        a_lo, a_run, a_dims, b_lo, b_run, b_dims = b_lo, b_run, b_dims, a_lo, a_run, a_dims
    if count(a_dims) > ENUMERATE:
        return True     # conservative (module doc)
    terms = _terms((), b_dims)
    for offset in _offsets(a_dims):
        base = a_lo + offset - b_lo
        try:
            if _solvable(terms, 1 - a_run - base, b_run - 1 - base, [BUDGET]):
                return True
        except _Exhausted:
            return True
    return False


def _offsets(dims: tuple):
    offsets = [0]
    for n, s in dims:
        offsets = [o + i * s for i in range(n) for o in offsets]
    return offsets


def enumerate_bytes(lo: int, run: int, dims: tuple) -> set:
    """Every byte touched (for tests and the oracle; small views only)."""
    return {lo + o + r for o in _offsets(dims) for r in range(run)}
