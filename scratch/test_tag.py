import sys
sys.path.insert(0, "examples")
from test_seed001_aclgraph_tagged_events import *

def test_show(npugraph):
    model = compiled(Model(wait_for_mm=False))
    model(*inputs())
    for h in npugraph.hazards:
        print("=====", h.kind, h.streams, h.where)
        print(h.message)
    raise SystemExit
