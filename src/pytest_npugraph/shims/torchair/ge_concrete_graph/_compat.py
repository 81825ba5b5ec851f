from torchair.core.utils import logger


def warn():
    logger.warning_once("The usage of torchair.ge_concrete_graph .* will not be supported in the future, please "
                        "complete the API switch as soon as possible.")
