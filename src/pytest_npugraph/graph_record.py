"""``npugraph.graphs`` entries: one per compiled FX graph run in the test (docs/reference.md, "The npugraph fixture")."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class GraphOp:
    """One node of the compiled graph: its name, its target and its stream (``None``: the graph's main
    stream — the capture stream in reduce-overhead mode; otherwise the ``npu_stream_switch`` tag)."""

    name: str
    op: str
    stream: Optional[str]


@dataclass
class GraphRecord:
    name: str                  # "graph_1", as TorchAir names FX graphs (dumps, counters)
    mode: str                  # "max-autotune" | "reduce-overhead" | "npugraph_ex"
    ops: list                  # GraphOp per node (after TorchAir's passes)
    fx_graph: Any = None       # the FX GraphModule the mode runs (for structural checks)
    keys: list = field(default_factory=list)   # reduce-overhead graph keys captured
    captures: int = 0          # graph keys captured (TorchAir's ``captured_<name>`` counter)
    recaptures: int = 0        # recaptures of a captured key (mutated input moved, stream limit changed)
    replays: int = 0           # replays of captured graphs
    runs: int = 0              # calls of the compiled graph
    fallback_to_eager: bool = False
    label: str = ""            # its name in reports, HTML and timelines: the user's function ("decode_step")

    def __post_init__(self) -> None:
        self.label = self.label or self.name

    def streams(self) -> set:
        """The stream labels ops run on (None: the main stream)."""
        return {op.stream for op in self.ops}

    def stream_of(self, needle: str) -> Optional[str]:
        """The stream of the first op whose target contains ``needle`` (e.g. ``"aten.mm"``)."""
        for op in self.ops:
            if needle in op.op:
                return op.stream
        raise KeyError(f"no op matching {needle!r} in {self.name}")

    def count(self, needle: str) -> int:
        return sum(needle in op.op for op in self.ops)
