"""Pruning the race engine's history changes no result (races.PRUNE_EVERY: the oracle's small
traces never reach the default, so they run here with a prune after every kernel too)."""
from hypothesis import given

from pytest_npugraph.analysis import happens_before, races

from .test_oracle import ORACLE, programs


@ORACLE
@given(programs())
def test_pruning_after_every_kernel_changes_no_conflict(trace):
    hb = happens_before.of(trace, {})
    default = races.PRUNE_EVERY
    whole = races._scan(trace, hb)
    try:
        races.PRUNE_EVERY = 1
        pruned = races._scan(trace, hb)
    finally:
        races.PRUNE_EVERY = default
    sig = [(c.earlier.seq, c.later.seq, c.kind, c.earlier_span, c.later_span) for c in whole]
    assert sig == [(c.earlier.seq, c.later.seq, c.kind, c.earlier_span, c.later_span) for c in pruned]
