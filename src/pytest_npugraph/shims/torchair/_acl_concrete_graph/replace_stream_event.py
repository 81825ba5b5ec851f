"""``GraphCounter`` (mirrors ``_acl_concrete_graph/replace_stream_event.py``): the counter behind the
``graph_<n>_`` prefix of the event tags ``replace_stream_event_pass`` makes.  The emulator counts per
test (``pytest_npugraph.compiler.stream_events.next_graph_id``), so every test starts from the first
id; ``set_graph_id`` is accepted for tests that reset TorchAir's process-wide counter."""


class GraphCounter:
    COUNT = -1

    @classmethod
    def graph_id(cls):
        cls.COUNT += 1
        return "graph_" + str(cls.COUNT) + "_"

    @classmethod
    def set_graph_id(cls, value):
        cls.COUNT = value
