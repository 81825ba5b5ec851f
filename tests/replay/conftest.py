from graph.conftest import fresh_dynamo  # noqa: F401  (each test compiles its own graphs)
