"""The ``npugraph_ex`` logger: torchair's logger (``torchair.core.utils``) under npugraph_ex's name
and line prefix."""
import logging
import os

from torchair.core.utils import _get_logger

__all__ = ["logger"]

logger = _get_logger(name="npugraph_ex", prefix="NPUGRAPH_EX",
                     level=logging.DEBUG if os.getenv("TORCH_COMPILE_DEBUG") == "1" else logging.ERROR)
