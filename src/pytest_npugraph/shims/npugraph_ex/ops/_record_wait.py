"""``npugraph_ex::record`` / ``npugraph_ex::wait`` (for custom passes): torchair's ``air`` twins,
defined by the same code (``torchair.ops._record_wait``)."""
from torchair.ops._record_wait import define_record_wait

from ._lib import lib

define_record_wait(lib, "npugraph_ex")
