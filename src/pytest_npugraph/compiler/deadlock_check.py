"""``options={"deadlock_check": True}``: after each capture, npugraph_ex runs its aclgraph deadlock
checker on the captured graph and prints its verdict.  Here pytest-npugraph's own deadlock analysis
(``analysis/deadlock.py``: every schedule of the trace, core occupation and collectives) runs on the
trace so far, and the risks involving the capture's tasks are printed in TorchAir's words."""
from __future__ import annotations


def report(trace, first_seq: int, last_seq: int) -> list:
    """Print the verdict for the tasks recorded in ``[first_seq, last_seq)``; returns the hazards."""
    from ..analysis import deadlock

    risks = [h for h in deadlock.find(trace) if any(first_seq <= s < last_seq for s in h.seqs)]
    if not risks:
        print("[RESULT] No deadlock risks detected.")
        return []
    print(f"\n[RESULT] Deadlock risk detected! {len(risks)} conflicting pair(s):\n")
    for hazard in risks:
        print("  CONFLICT: " + hazard.message.replace("\n", "\n    "))
    return risks
