"""``torchair.ops``: ``npu_print``, tagged events, ``npu_record_tagged_stream``, ``record``/``wait``."""
import torch

from ._record_wait import _record, _wait


def npu_fused_infer_attention_score(*args, **kwargs):
    return torch.ops.npu.npu_fused_infer_attention_score(*args, **kwargs)


def npu_fused_infer_attention_score_v2(*args, **kwargs):
    return torch.ops.npu.npu_fused_infer_attention_score_v2(*args, **kwargs)


def npu_print(*args, summarize_size=3, tensor_detail=False):
    from ._print_ops import _npu_print

    return _npu_print(*args, summarize_size=summarize_size, tensor_detail=tensor_detail)


def npu_create_tagged_event(tag: str):
    from ._tagged_event import _npu_create_tagged_event

    return _npu_create_tagged_event(tag)


def npu_tagged_event_record(event):
    from ._tagged_event import _npu_tagged_event_record

    return _npu_tagged_event_record(event)


def npu_tagged_event_wait(event):
    from ._tagged_event import _npu_tagged_event_wait

    return _npu_tagged_event_wait(event)


# records ``input`` as used on the stream of tag ``tagged_stream`` (reduce-overhead graphs cannot hold
# Tensor.record_stream); pass 'default' on the main stream
def npu_record_tagged_stream(input: torch.Tensor, tagged_stream: str):
    from ._tagged_event import _npu_record_tagged_stream

    return _npu_record_tagged_stream(input, tagged_stream)


def wait(tensors: list):
    return _wait(tensors)


def record():
    return _record()
