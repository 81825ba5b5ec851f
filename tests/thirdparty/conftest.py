import pytest

pytest.importorskip("transformers", reason="tests/thirdparty needs the test extra: pip install -e '.[test]'")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles its own graphs (Dynamo caches by code object)."""
    import torch

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
