"""Per-test op profiles through the users' hook, as a suite's conftest.py would supply them.

Why: collectives ask ``pytest_npugraph_op_profile`` on every call, so a test can give
reduce-scatter 16 vector cores (seed 000) without affecting the tests around it.
"""
import pytest

PROFILES: dict = {}


def pytest_npugraph_op_profile(op_name):
    return PROFILES.get(op_name)


@pytest.fixture
def op_profiles():
    PROFILES.clear()
    yield PROFILES
    PROFILES.clear()
