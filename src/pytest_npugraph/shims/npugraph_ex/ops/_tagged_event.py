"""The ``npugraph_ex::`` tagged-event ops: torchair's (``torchair.ops._tagged_event``, the same kernels)
in npugraph_ex's namespace, plus ``record_tagged_on_stream``; what ``replace_stream_event_pass`` and
the event closure put into a graph."""
from torchair.ops._tagged_event import define_tagged_event_ops

from ._lib import lib

define_tagged_event_ops(lib, "npugraph_ex", tensor_on_stream=True)
