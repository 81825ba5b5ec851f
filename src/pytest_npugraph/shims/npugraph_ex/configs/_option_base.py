"""npugraph_ex's option values: torchair's (``torchair.configs._option_base``), except that an
``OptionValue`` reads bools as bools (npugraph_ex's ``value``); the checks and error texts are one."""
from torchair.configs import _option_base as _torchair
from torchair.configs._option_base import (  # noqa: F401
    CallableValue, DictOptionValue, IntListValue, IntRangeValue, MustExistedPathValue, NpuBaseConfig)


class OptionValue(_torchair.OptionValue):
    bools_as_text = False
