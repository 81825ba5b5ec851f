"""``torchair._acl_concrete_graph.fx2acl_converter``: ``AclConcreteGraph`` is the class of a compiled
reduce-overhead / npugraph_ex graph (calling an instance runs it: capture, then replays), the
emulator's (``pytest_npugraph.compiler.aclgraph``); tests that wrap its ``__call__`` see every run.
Its attributes are the emulator's, not TorchAir's."""
from pytest_npugraph.compiler.aclgraph import AclConcreteGraph

__all__ = ["AclConcreteGraph"]
