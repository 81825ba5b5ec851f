"""torchair's logger (``torchair.core.utils.logger``): name "torchair", to stdout, ERROR unless
``TORCH_COMPILE_DEBUG=1``; users raise it to DEBUG to see what the compiler does."""
from __future__ import annotations

import functools
import logging
import os
import sys
import threading
from datetime import datetime

__all__ = []

EVENT_LEVEL = 35
logging.addLevelName(EVENT_LEVEL, "EVENT")


class _EventLogger(logging.Logger):
    def event(self, msg, *args, **kwargs):
        if self.isEnabledFor(EVENT_LEVEL):
            self._log(EVENT_LEVEL, msg, args, **kwargs)


class _MillisecAndMicrosecFormatter(logging.Formatter):
    def formatTime(self, record, datefmt=None):
        ct = datetime.fromtimestamp(record.created)
        return ct.strftime("%Y-%m-%d %H:%M:%S") + f".{ct.microsecond // 1000:03d}.{ct.microsecond % 1000:03d}"


def _get_logger(*, level=logging.ERROR, output=sys.stdout, file=None, name=None, prefix="TORCHAIR"):
    """The product's logger; npugraph_ex's is this one named "npugraph_ex" with prefix "NPUGRAPH_EX"."""
    previous = logging.getLoggerClass()
    logging.setLoggerClass(_EventLogger)
    try:
        torchair_logger = logging.getLogger(name)
    finally:
        logging.setLoggerClass(previous)
    torchair_logger.setLevel(level)
    formatter = _MillisecAndMicrosecFormatter(
        f"[%(levelname)s] {prefix}({os.getpid()},{os.path.basename(sys.executable)})"
        f":%(asctime)s [%(filename)s:%(lineno)d]{threading.get_native_id()} %(message)s")
    if output and not torchair_logger.handlers:
        handler = logging.StreamHandler(output)
        handler.setFormatter(formatter)
        torchair_logger.addHandler(handler)
    if file:
        handler = logging.FileHandler(file, encoding="utf-8", delay=False)
        handler.setFormatter(formatter)
        torchair_logger.addHandler(handler)
    torchair_logger.warning_once = functools.lru_cache(None)(torchair_logger.warning)
    return torchair_logger


logger = _get_logger(name="torchair", level=logging.DEBUG if os.getenv("TORCH_COMPILE_DEBUG") == "1" else logging.ERROR)
