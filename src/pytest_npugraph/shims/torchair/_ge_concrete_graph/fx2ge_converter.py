"""``ExportSuccess`` (what the export-mode GE graph raises once the export is written)."""
from pytest_npugraph.compiler.export import ExportSuccess  # noqa: F401
