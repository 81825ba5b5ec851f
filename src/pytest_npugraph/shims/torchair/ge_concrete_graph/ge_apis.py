from ._compat import warn

warn()
