from distributed.conftest import op_profiles, pytest_npugraph_op_profile  # noqa: F401  (per-test op profiles)
from graph.conftest import fresh_dynamo  # noqa: F401  (each test compiles its own graphs)
