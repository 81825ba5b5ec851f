import pytest


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles its own graphs (Dynamo caches by code object)."""
    import torch

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
