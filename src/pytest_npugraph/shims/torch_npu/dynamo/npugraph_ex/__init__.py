"""``torch_npu.dynamo.npugraph_ex``: the npugraph_ex package torch_npu bundles; the same modules as
``import npugraph_ex`` (torch_npu registers that name too)."""
import sys

import npugraph_ex as _npugraph_ex

for _name, _module in list(sys.modules.items()):
    if _name == "npugraph_ex" or _name.startswith("npugraph_ex."):
        sys.modules[__name__ + _name[len("npugraph_ex"):]] = _module
