"""``GraphCounter`` (mirrors ``_acl_concrete_graph/replace_stream_event.py``): the counter behind the
``graph_<n>_`` prefix of the event tags ``replace_stream_event_pass`` makes.  The emulator counts per
test (``pytest_npugraph.compiler.stream_events.next_graph_id``), so every test starts from the first
id; ``set_graph_id`` is accepted for tests that reset TorchAir's process-wide counter."""
import torch


class GraphCounter:
    COUNT = -1

    @classmethod
    def graph_id(cls):
        cls.COUNT += 1
        return "graph_" + str(cls.COUNT) + "_"

    @classmethod
    def set_graph_id(cls, value):
        cls.COUNT = value


def replace_stream_event_pass(gm):
    """TorchAir's pass on a Dynamo graph (for a custom backend): native stream/event calls become
    stream scopes and tagged events (``pytest_npugraph.compiler.stream_events``, the pass the aclgraph
    modes run); the tags take the next ``graph_<n>_`` of the test.  The nodes call the ops' packets
    (``torch.ops.air.scope_enter``), as TorchAir writes them, not their ``.default`` overloads."""
    return scoped_replace_stream_event_pass(gm, "air")


def scoped_replace_stream_event_pass(gm, namespace: str):
    """The pass with the stream scopes in ``namespace`` (torchair: ``air``; npugraph_ex's own)."""
    import npugraph_ex.ops._tagged_event  # noqa: F401  (the npugraph_ex:: event ops the pass writes)
    from pytest_npugraph.compiler import stream_events
    from pytest_npugraph.runtime.runtime import current

    gm = stream_events.replace_stream_event_pass(gm, namespace, stream_events.next_graph_id(current()))
    changed = False
    for node in gm.graph.nodes:
        target = node.target
        if node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and \
                target.namespace in ("air", "npugraph_ex") and target._overloadname == "default":
            node.target = target.overloadpacket
            changed = True
    if changed:
        gm.recompile()
    return gm
