"""The allocator's statistics log (``Stats``) against counters updated one change at a time.

``Stats`` logs every change and applies the log in one vectorised pass when the statistics are read;
the oracle here is the plain rule each counter follows (a rise adds to ``allocated`` and may raise
``peak``, a fall adds to ``freed``), applied change by change, with reads at random points between.
"""
import pytest
from hypothesis import given, settings, strategies as st

from pytest_npugraph.runtime.allocator import Stats

KINDS = list(Stats.KINDS)


def oracle_apply(counters: dict, kind: str, small: bool, x: int, y: int) -> None:
    """One change, counter by counter: ``counters[(array, pool)] = [current, peak, allocated, freed]``."""
    for name, (const, cx, cy) in Stats.KINDS[kind].items():
        amount = const + cx * x + cy * y
        for pool in ("all", "small_pool" if small else "large_pool"):
            c = counters.setdefault((name, pool), [0, 0, 0, 0])
            c[0] += amount
            if amount > 0:
                c[2] += amount
                c[1] = max(c[1], c[0])
            else:
                c[3] -= amount


changes = st.lists(st.tuples(st.sampled_from(KINDS), st.booleans(), st.integers(0, 1 << 40),
                             st.integers(0, 1 << 40), st.booleans()), max_size=60)


@pytest.mark.parametrize("by_hand, per_pass", [(0, 4096), (0, 5), (1000, 4096)],
                         ids=["vectorised", "vectorised-in-passes", "by-hand"])
@settings(max_examples=40, deadline=None)
@given(script=changes)
def test_logged_changes_read_as_counters_updated_one_at_a_time(by_hand, per_pass, script):
    stats, counters = Stats(), {}
    stats.ROWS_BY_HAND, stats.ROWS_PER_PASS = by_hand, per_pass
    for kind, small, x, y, read_now in script:
        stats.log.extend((Stats.code(kind, small), x, y))
        oracle_apply(counters, kind, small, x, y)
        if read_now:            # a read applies the log so far; later changes continue from there
            stats.values
    for name in Stats.ARRAYS:
        for pool in Stats.POOLS:
            v = stats.values[name][pool]
            assert [v.current, v.peak, v.allocated, v.freed] == counters.get((name, pool), [0, 0, 0, 0]), (name, pool)


def test_reading_applies_the_log_once_and_resets_see_applied_values():
    stats = Stats()
    stats.log.extend((Stats.code("malloced", True), 4096, 4000))
    stats.log.extend((Stats.code("freed", True), 4096, 0))
    stats.reset_peaks()                          # peaks drop to the applied current values
    assert stats.values["allocated_bytes"]["all"].peak == 0
    stats.log.extend((Stats.code("malloced"), 1 << 21, 1 << 21))
    nested = stats.as_nested_dict()
    assert nested["allocated_bytes"]["large_pool"] == {"current": 1 << 21, "peak": 1 << 21,
                                                       "allocated": 1 << 21, "freed": 0}
    assert nested["allocated_bytes"]["small_pool"]["allocated"] == 4096
    assert nested["allocation"]["all"] == {"current": 1, "peak": 1, "allocated": 2, "freed": 1}


@pytest.mark.parametrize("by_hand", [0, 1000], ids=["vectorised", "by-hand"])
def test_reads_while_another_thread_logs_lose_nothing(by_hand):
    """``run_ranks`` threads allocate while another thread may read the statistics: a read applies what
    was logged so far and must neither drop later entries nor make the logging thread fail."""
    import sys
    import threading

    stats = Stats()
    stats.ROWS_BY_HAND = by_hand
    n, failures = 20000, []
    malloced, freed = Stats.code("malloced", True), Stats.code("freed", True)

    def allocate():
        try:
            for _ in range(n):
                stats.log.extend((malloced, 512, 500))
                stats.log.extend((freed, 512, 0))
        except Exception as error:  # noqa: BLE001 - reported below
            failures.append(error)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)             # switch threads as often as possible
    try:
        worker = threading.Thread(target=allocate)
        worker.start()
        while worker.is_alive():
            stats.values
        worker.join()
    finally:
        sys.setswitchinterval(interval)
    assert not failures
    allocation = stats.values["allocation"]["small_pool"]
    assert (allocation.allocated, allocation.freed, allocation.current) == (n, n, 0)
    assert stats.values["allocated_bytes"]["all"].allocated == 512 * n
