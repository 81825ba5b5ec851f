"""The ``npugraph_ex`` logger."""
import logging

__all__ = ["logger"]

logger = logging.getLogger("npugraph_ex")
