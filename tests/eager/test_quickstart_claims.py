"""What docs/quickstart.md says about its example holds: the race is on ``shared`` alone, and ``x``
(device work on the main stream) is safe only because ``w``'s blocking host-to-device copy comes after
it; with the copy first, reading ``x`` on the side stream races too (issue 27)."""
import pytest
import torch
import torch_npu  # noqa: F401


def shared_expert_overlap(x, w):
    side = torch.npu.Stream()
    with torch.npu.stream(side):          # the shared expert on a side stream
        shared = x @ w
    return shared + 1                     # consumed on the main stream


def races(npugraph):
    return [h for h in npugraph.hazards if h.kind == "race"]


@pytest.mark.npu_allow("race")
def test_as_written_only_shared_races(npugraph):
    x = torch.randn(64, 128, device="npu")        # device work on the main stream
    w = torch.randn(128, 128).npu()               # blocking copy: the host waits for the main stream
    shared_expert_overlap(x, w)
    (race,) = races(npugraph)
    assert "npu:0/default reads it in aten::add.Tensor" in race.message
    assert "may still be writing it in aten::mm" in race.message


@pytest.mark.npu_allow("race")
def test_with_the_copy_first_x_races_as_well(npugraph):
    w = torch.randn(128, 128).npu()
    x = torch.randn(64, 128, device="npu")        # nothing after it makes the host wait for it
    shared_expert_overlap(x, w)
    found = races(npugraph)
    assert len(found) == 2, [h.message for h in found]
    assert any("reads it in aten::mm" in h.message and "may still be writing it in aten::normal_" in h.message
               for h in found), [h.message for h in found]
