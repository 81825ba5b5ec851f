"""The collectives' errors (ranks.py raises them, the math checks raise CollectiveError)."""


class CollectiveError(RuntimeError):
    """Collectives that cannot complete (mismatched, abandoned, circular, timed out) or whose
    arguments do not agree across ranks; the message names ranks, ops and user lines."""


class CollectiveAborted(CollectiveError):
    """Raised in the ranks that were waiting when another rank's failure ended the job."""
