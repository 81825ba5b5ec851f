"""One report per root cause (issue 27): hazards that read the same but for the device are one report;
different lines, kinds or two occurrences on one device stay apart."""
from pytest_npugraph.analysis import same_on_devices
from pytest_npugraph.hazard import Hazard


def race(device: int, where=("m.py:3", "m.py:5"), address="0x1000", kind="race") -> Hazard:
    return Hazard(kind, f"race on npu:{device} at {address}: npu:{device}/side reads it (Event#1 of rank {device})",
                  where=list(where), streams=[f"npu:{device}/default", f"npu:{device}/side"], seqs=(device,))


def test_the_same_hazard_on_two_devices_is_one_report_listing_both():
    (h,) = same_on_devices([race(0), race(1, address="0x2000")])
    assert h.message.endswith("(Event#1 of rank 0)\n(the same on npu:1)")
    assert h.streams == ["npu:0/default", "npu:0/side", "npu:1/default", "npu:1/side"]
    assert h.seqs == (0, 1)


def test_other_lines_other_kinds_and_the_same_device_stay_apart():
    hazards = [race(0), race(1, where=("m.py:3", "m.py:6")), race(1, kind="event-misuse"), race(0)]
    assert same_on_devices(hazards) == hazards
    assert all("the same on" not in h.message for h in hazards)
