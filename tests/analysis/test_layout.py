"""Exact element overlap of strided views (``layout``) against enumerating their bytes."""
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_npugraph import layout
from pytest_npugraph.trace import Span

views = st.tuples(st.integers(0, 40), st.sampled_from([1, 2, 4]),
                  st.lists(st.tuples(st.integers(1, 5), st.integers(0, 12)), min_size=0, max_size=3))


def span(view) -> Span:
    offset, item, dims = view
    shape, strides = [n for n, _ in dims], [s for _, s in dims]
    return Span.of_view(0, 1, offset * item, item, shape, strides)


def touched(view) -> set:
    offset, item, dims = view
    starts = {offset}
    for n, s in dims:
        starts = {o + i * s for o in starts for i in range(n)}
    return {o * item + r for o in starts for r in range(item)}


@settings(max_examples=600, deadline=None)
@given(views, views)
def test_overlap_is_exactly_a_shared_byte(a, b):
    sa, sb = span(a), span(b)
    assert layout.enumerate_bytes(sa.lo, sa.run or sa.hi - sa.lo, sa.dims) == touched(a)
    assert sa.overlaps(sb) == bool(touched(a) & touched(b))


def test_column_halves_and_interleaved_halves_are_disjoint():
    left = Span.of_view(0, 1, 0, 4, (4, 4), (8, 1))      # x[:, :4] of a 4x8 float tensor
    right = Span.of_view(0, 1, 16, 4, (4, 4), (8, 1))    # x[:, 4:]
    assert (left.lo, left.hi, right.lo, right.hi) == (0, 112, 16, 128)
    assert not left.overlaps(right) and left.overlaps(left)
    even = Span.of_view(0, 1, 0, 2, (5000,), (2,))       # a[0::2], a[1::2] of 10,000 halves
    odd = Span.of_view(0, 1, 2, 2, (5000,), (2,))
    assert not even.overlaps(odd)
    assert odd.overlaps(Span.of_view(0, 1, 2 * 9999, 2, (1,), (1,)))


def test_transposed_and_expanded_views_are_dense():
    assert Span.of_view(0, 1, 0, 4, (8, 4), (1, 8)).dims == ()            # x.t()
    assert Span.of_view(0, 1, 0, 4, (3, 8), (0, 1)).dims == ()            # expand
    assert Span.of_view(0, 1, 0, 4, (7, 4), (2, 1)).dims == ()            # unfold(0, 4, 2)


def test_a_large_mismatched_lattice_stays_exact():
    a = Span.of_view(0, 1, 0, 1, (3000,), (3,))
    b = Span.of_view(0, 1, 1, 1, (3000,), (5,))
    assert a.overlaps(b)                                   # 1 + 5*1 = 6 = 3*2
    c = Span.of_view(0, 1, 1, 1, (3000,), (6,))
    assert not Span.of_view(0, 1, 0, 1, (3000,), (3,)).overlaps(Span.of_view(0, 1, 1, 1, (2000,), (3,)))
    assert not Span.of_view(0, 1, 0, 1, (4000,), (2,)).overlaps(Span.of_view(0, 1, 1, 1, (3000,), (6,)))
    assert c.overlaps(Span.of_view(0, 1, 0, 1, (4000,), (1,)))
