"""Hazards: what the analyses find, as plain data (docs/reference.md, "Hazards")."""
from __future__ import annotations

from dataclasses import dataclass, field

KINDS = (
    "race",
    "missing-record-stream",
    "event-misuse",
    "core-limit",
    "deadlock",
    "limit-ineffective",
    "reinplace-conflict",
    "output-overwrite",
    "super-kernel",
)


@dataclass
class Hazard:
    """One finding.

    ``where`` holds the user's source locations (``path:line``) of each access or call
    involved; ``streams`` and ``ops`` name what took part.  ``seqs`` are the trace
    positions involved (used to attribute a hazard to an ``npugraph.expect`` block).
    """

    kind: str
    message: str
    where: list = field(default_factory=list)
    streams: list = field(default_factory=list)
    ops: list = field(default_factory=list)
    seqs: tuple = ()
    severity: str = "error"  # "error" or "warning" (e.g. a reinplace pass vetoed)
    summary: str = ""        # one line for when the hazard is shown inside another (a deadlock's cause)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown hazard kind {self.kind!r}; expected one of {', '.join(KINDS)}")

    @property
    def key(self) -> tuple:
        """Identity used to report a hazard once (kind, places, streams)."""
        return (self.kind, tuple(self.where), tuple(self.streams))

    def __str__(self) -> str:
        return f"[{self.kind}] {self.message}"


class NpuHazardWarning(UserWarning):
    """Emitted for each hazard under ``--npu-hazards=warn``."""
