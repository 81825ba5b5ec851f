"""``npugraph_ex.ops``: the ``npugraph_ex::`` ops the compiler puts into graphs (tagged events, stream
waits, tagged record_stream, record/wait).  npugraph_ex has no public tagged-event API: users write
native ``torch.npu.Stream``/``Event`` code."""
from . import _record_wait, _tagged_event  # noqa: F401
