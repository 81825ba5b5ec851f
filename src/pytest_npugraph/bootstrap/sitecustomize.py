"""Started by Python in every process whose ``PYTHONPATH`` holds this folder (inherit.py puts it
there while a test runs): with ``NPUGRAPH_CHILD`` set, the process is a child of that test and
emulates its NPU (``pytest_npugraph.child.start``); without it, nothing happens.  Either way the
next ``sitecustomize`` on the path (a virtualenv's, a distribution's) runs as it would have."""
import os
import sys


def _chain() -> None:
    """Run the ``sitecustomize`` this one hides, if any."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _start() -> None:
    directory = os.environ.get("NPUGRAPH_CHILD")
    if not directory or not os.environ.get("NPUGRAPH_CHILD_CONFIG"):
        return
    try:
        from pytest_npugraph import child
    except ImportError:         # an interpreter without the plugin (another virtualenv): nothing to emulate
        return
    child.start(directory)


try:
    _start()
finally:
    _chain()
