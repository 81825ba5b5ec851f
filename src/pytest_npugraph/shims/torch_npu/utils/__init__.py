"""``torch_npu.utils``: the Dynamo integration (``_dynamo``)."""
