import pytest


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles its own graphs (Dynamo caches by code object) and reads its own counters."""
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
