"""``torchair.dynamo_export``: the graph compiled in GE mode with ``config.export.export_mode`` is not
run; its first call writes the export folder and raises ``ExportSuccess`` (which ``dynamo_export``
catches), as TorchAir does.

The folder (``<export_path>``, or ``<export_path>/rank_<r>`` under torch.distributed) holds
``dynamo.pbtxt`` (the graph: ``Data`` for each user input, ``Const`` for each model weight,
``Shape`` for each symbolic size, the ops with their streams, ``NetOutput``), ``options.json`` (the
compile/execute options TorchAir exports) and ``<export_name>.air``.  The real ``.air`` is GE's binary
model, built by GE; the emulator's is a placeholder holding a marker line and the graph text, and
cannot be loaded by ATC or GE."""
from __future__ import annotations

import json
import os

from . import graph_dump

AIR_MARKER = b"pytest-npugraph placeholder for a GE .air model (emulated export; not loadable by GE/ATC)\n"


class ExportSuccess(Exception):
    """Raised when the export has been written (TorchAir: ``fx2ge_converter.ExportSuccess``)."""


def _rank():
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None


def export(gm, name: str, lanes: dict, args, settings) -> None:
    export_dir, export_name, weight_names = settings.export
    rank = _rank()
    folder = export_dir if rank is None else os.path.join(export_dir, f"rank_{rank}")
    os.makedirs(folder, exist_ok=True)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    kinds = {}
    for node, arg in zip(placeholders, args):
        if not hasattr(arg, "shape"):
            kinds[node] = "Shape"                      # a symbolic size of a dynamic input
        elif id(arg) in weight_names:
            kinds[node] = "Const"                      # a weight, folded into the model
    text = graph_dump.pbtxt(gm, lanes, kinds)
    with open(os.path.join(folder, "dynamo.pbtxt"), "w", encoding="utf-8") as f:
        f.write(text)
    options = {"compile options": {"global": {}, "session": {}, "graph": {}},
               "execute options": {"global": {}, "session": {}, "graph": {}}}
    with open(os.path.join(folder, "options.json"), "w", encoding="utf-8") as f:
        json.dump(options, f, indent=4, ensure_ascii=False)
    air = f"{export_name}.air" if rank is None else f"{export_name}_rank_{rank}.air"
    with open(os.path.join(export_dir, air), "wb") as f:
        f.write(AIR_MARKER + f"graph {name}\n".encode() + text.encode())
    raise ExportSuccess("export graph over")
