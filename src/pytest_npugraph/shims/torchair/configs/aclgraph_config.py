"""``CompilerConfig.aclgraph_config`` (a plain object: ``use_custom_pool`` is checked only when a graph
is built from the config)."""
__all__ = []


class _AclGraphConfig:
    """Config for AclGraph option"""

    def __init__(self) -> None:
        self.use_custom_pool = None
