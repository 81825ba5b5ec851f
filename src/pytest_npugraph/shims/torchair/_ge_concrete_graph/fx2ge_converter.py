"""``ExportSuccess`` (what the export-mode GE graph raises once the export is written)."""
from pytest_npugraph.compiler.export import ExportSuccess  # noqa: F401


def register_fx_node_ge_converter(aten_op):
    """Keeps the converter on the op (``op._ge_converter``, as TorchAir); the emulator runs the op's
    kernel instead (see ``torchair.ge``)."""
    def register(converter):
        aten_op._ge_converter = converter
        return converter
    return register


def declare_supported(supported_specs):
    def add_testcase(converter):
        return converter
    return add_testcase
