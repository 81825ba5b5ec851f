"""Strided views race by the elements they share, not by their byte ranges (docs/hazards/race.md)."""
import torch
import torch_npu  # noqa: F401


def forked():
    side = torch.npu.Stream()
    side.wait_stream(torch.npu.current_stream())
    return side


def test_column_halves_on_two_streams_do_not_race(npugraph):
    x = torch.randn(4, 8, device="npu")
    side = forked()
    with torch.npu.stream(side):
        x[:, :4].zero_()
    right = x[:, 4:].sum()
    assert npugraph.hazards == []
    torch.npu.current_stream().wait_stream(side)
    assert x.cpu()[:, :4].abs().sum() == 0
    torch.testing.assert_close(right.cpu(), x.cpu()[:, 4:].sum())


def test_overlapping_columns_race_and_the_report_says_elements(npugraph):
    x = torch.randn(4, 8, device="npu")
    side = forked()
    with torch.npu.stream(side):
        x[:, :5].zero_()
    with npugraph.expect("race", match=r"sharing elements within its bytes \[16, 116\)"):
        x[:, 4:].sum()


def test_interleaved_halves_do_not_race(npugraph):
    a = torch.randn(64, device="npu")
    side = forked()
    with torch.npu.stream(side):
        a[0::2].mul_(2)
    a[1::2].add_(1)
    torch.npu.current_stream().wait_stream(side)
    assert npugraph.hazards == []


def test_every_third_element_meets_the_even_ones(npugraph):
    a = torch.randn(64, device="npu")
    side = forked()
    with torch.npu.stream(side):
        a[0::2].mul_(2)
    with npugraph.expect("race"):
        a[0::3].add_(1)


def test_heads_split_of_a_fused_qkv_on_three_streams(npugraph):
    qkv = torch.randn(16, 3 * 64, device="npu")
    s1, s2 = forked(), forked()
    with torch.npu.stream(s1):
        qkv[:, 64:128].mul_(0.5)               # k
    with torch.npu.stream(s2):
        qkv[:, 128:].add_(1)                   # v
    q = qkv[:, :64] * 2                        # q on main
    assert npugraph.hazards == []
    assert q.shape == (16, 64)
