"""What the plugin shows people: timelines (Chrome-trace JSON, timeline.py), the HTML report
(html.py, written through export.py) and DOT pictures of compiled graphs (dot.py).

``to_dot``, ``graph_of`` and ``replay_graph`` are re-exported lazily: only they import networkx.
"""


def __getattr__(name):
    if name in ("to_dot", "graph_of", "replay_graph"):
        from . import dot

        return getattr(dot, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
