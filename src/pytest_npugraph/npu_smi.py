"""An ``npu-smi`` on PATH while the emulation is active, answering for the emulated chips.

Ascend code and test suites probe ``npu-smi info`` to decide whether an NPU is there (vLLM-Ascend's
tests/ut conftest replaces torch_npu with MagicMock when it fails; its setup.py and CPU binding parse
``-l``, ``-m``, ``-t board -i N [-c C]`` and ``-t health``).  The plugin writes a small Python script
(run by the interpreter running pytest) into a per-session temporary directory, prepends that
directory to ``PATH`` for the session, and sets the chip name and device count of the running test in
the environment (``NPUGRAPH_SMI_CHIP``, ``NPUGRAPH_SMI_DEVICES``), so the test and the processes it
starts see the emulated devices; ``PATH`` and the variables are given back, and the directory removed,
when the session ends.  The layout follows the real tool's tables; usage figures are those of an idle
device (no HBM in use, no processes).  Imports neither torch nor pytest.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

ENV_CHIP = "NPUGRAPH_SMI_CHIP"
ENV_DEVICES = "NPUGRAPH_SMI_DEVICES"
VERSION = "24.1.rc2"
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Installed:
    """The session's ``npu-smi``: its directory and what installing it changed in ``os.environ``."""

    def __init__(self, chip: str, devices: int = 1):
        self.directory = tempfile.mkdtemp(prefix="npugraph-npu-smi-")
        path = os.path.join(self.directory, "npu-smi")
        with open(path, "w") as f:
            f.write(f"#!{sys.executable}\n"
                    "# pytest-npugraph: the emulated npu-smi (removed when the pytest session ends)\n"
                    "import sys\n"
                    f"sys.path.insert(0, {_PACKAGE_PARENT!r})\n"
                    "from pytest_npugraph.npu_smi import main\n"
                    "sys.exit(main(sys.argv[1:]))\n")
        os.chmod(path, 0o755)
        self.saved = {name: os.environ.get(name) for name in ("PATH", ENV_CHIP, ENV_DEVICES)}
        os.environ["PATH"] = self.directory + os.pathsep + os.environ.get("PATH", "")
        self.default = (chip, devices)
        self.set(chip, devices)

    def set(self, chip: str, devices: int) -> None:
        os.environ[ENV_CHIP] = chip
        os.environ[ENV_DEVICES] = str(devices)

    def reset(self) -> None:
        self.set(*self.default)

    def remove(self) -> None:
        path = os.environ.get("PATH", "")
        parts = [p for p in path.split(os.pathsep) if p != self.directory]
        os.environ["PATH"] = os.pathsep.join(parts)
        for name in (ENV_CHIP, ENV_DEVICES):
            if self.saved[name] is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = self.saved[name]
        shutil.rmtree(self.directory, ignore_errors=True)


# ----------------------------------------------------------------------------- the tool
def _chips():
    from pytest_npugraph.chips import DEFAULT_CHIP, lookup

    name = os.environ.get(ENV_CHIP) or DEFAULT_CHIP
    try:
        profile = lookup(name)
    except KeyError:
        profile = lookup(DEFAULT_CHIP)
    return profile, max(1, int(os.environ.get(ENV_DEVICES) or 1))


def _is_a3(name: str) -> bool:
    return name.startswith("Ascend910_93")


def _layout(profile, devices: int):
    """(npu id, chip id, logic id) of each emulated device: an A3 card carries two chips (dies)."""
    per_card = 2 if _is_a3(profile.name) else 1
    return [(i // per_card, i % per_card, i) for i in range(devices)]


def _names(profile):
    """(name column of ``npu-smi info``, Chip Type, Chip Name, NPU Name) as the real tool prints them."""
    name = profile.name
    if _is_a3(name):
        return "Ascend910", "", "Ascend910", name.split("_")[1]
    return name[len("Ascend"):], "Ascend", name[len("Ascend"):], ""


def _bus_id(npu: int, chip: int) -> str:
    return f"0000:{0xC1 - 0x20 * npu + 2 * chip & 0xFF:02X}:00.0"


def _table(profile, devices: int) -> str:
    name, _, _, _ = _names(profile)
    hbm_mb = profile.hbm_bytes >> 20
    bar = "+" + "-" * 27 + "+" + "-" * 15 + "+" + "-" * 52 + "+"
    sep = "+" + "=" * 27 + "+" + "=" * 15 + "+" + "=" * 52 + "+"
    lines = ["+" + "-" * 96 + "+",
             f"| npu-smi {VERSION:<25}Version: {VERSION:<53}|", bar,
             "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|",
             "| Chip" + (" Phy-ID" if _is_a3(profile.name) else "") +
             " " * (22 - (7 if _is_a3(profile.name) else 0)) +
             "| Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |", sep]
    for npu, chip, logic in _layout(profile, devices):
        lines.append(f"| {npu:<5} {name:<19} | {'OK':<13} | {'90.0':<11} {'36':<17} {'0    / 0':<20} |")
        first = f"{chip:<5} {logic}" if _is_a3(profile.name) else f"{chip}"
        lines.append(f"| {first:<25} | {_bus_id(npu, chip):<13} | {'0':<11} {'0    / 0':<17} "
                     f"{f'0    / {hbm_mb}':<20} |")
        lines.append(sep)
    lines += [bar, "| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |",
              sep]
    for npu in sorted({n for n, _, _ in _layout(profile, devices)}):
        lines.append(f"| {f'No running processes found in NPU {npu}':<94} |")
        lines.append(sep)
    return "\n".join(lines)


def _field(key: str, value) -> str:
    return f"        {key:<31}: {value}"


def _list(profile, devices: int) -> str:
    cards = sorted({npu for npu, _, _ in _layout(profile, devices)})
    out = [_field("Total Count", len(cards)), ""]
    for npu in cards:
        chips = sum(1 for n, _, _ in _layout(profile, devices) if n == npu)
        out += [_field("NPU ID", npu), _field("Product Name", "IT21PDDA01"), _field("Serial Number", f"EMU{npu:09d}"),
                _field("Chip Count", chips), ""]
    return "\n".join(out)


def _board(profile, devices: int, npu: int, chip) -> str:
    layout = _layout(profile, devices)
    if not any(n == npu for n, _, _ in layout):
        return None
    out = [_field("NPU ID", npu), _field("Product Name", "IT21PDDA01"), _field("Model", "NA"),
           _field("Manufacturer", "Huawei"), _field("Serial Number", f"EMU{npu:09d}"),
           _field("Software Version", VERSION), _field("Firmware Version", "7.5.0.1.129"),
           _field("Compatibility", "OK"), _field("Board ID", "0x64"), _field("PCB ID", "A"), _field("BOM ID", 1),
           _field("PCIe Bus Info", _bus_id(npu, 0 if chip is None else chip)), _field("Slot ID", npu),
           _field("Class ID", "NA"), _field("PCI Vendor ID", "0x19E5"), _field("PCI Device ID", "0xD802"),
           _field("Subsystem Vendor ID", "0x0200"), _field("Subsystem Device ID", "0x0100"),
           _field("Chip Count", sum(1 for n, _, _ in layout if n == npu))]
    if chip is not None:
        if not any(n == npu and c == chip for n, c, _ in layout):
            return None
        _, chip_type, chip_name, npu_name = _names(profile)
        if chip_type:
            out.append(_field("Chip Type", chip_type))
        out += [_field("Chip Name", chip_name), _field("Chip Version", "V1")]
        if npu_name:
            out.append(_field("NPU Name", npu_name))
        out.append(_field("Chip Logic ID", next(i for n, c, i in layout if n == npu and c == chip)))
    return "\n".join(out)


def _mapping(profile, devices: int) -> str:
    name = "Ascend " + _names(profile)[2] if not _is_a3(profile.name) else "Ascend 910"
    out = [f"        {'NPU ID':<31}{'Chip ID':<31}{'Chip Logic ID':<31}Chip Name"]
    for npu, chip, logic in _layout(profile, devices):
        out.append(f"        {npu:<31}{chip:<31}{logic:<31}{name}")
    return "\n".join(out)


def _topo(profile, devices: int) -> str:
    n = devices
    head = " " * 11 + "".join(f"NPU{i:<8}" for i in range(n)) + "CPU Affinity"
    rows = [head]
    cpus = os.cpu_count() or 1
    for i in range(n):
        cells = "".join(f"{'X' if i == j else 'HCCS':<11}" for j in range(n))
        rows.append(f"NPU{i:<7}" + " " + cells + f"0-{cpus - 1}")
    rows += ["", "Legend:", "", "  X    = Self", "  HCCS = Connection traversing HCCS."]
    return "\n".join(rows)


def _usage() -> str:
    return ("Usage: npu-smi info [-l | -m | -t <type> -i <id> [-c <chip_id>]]\n"
            "  (pytest-npugraph's emulated npu-smi: info, info -l, info -m, info -t board|health|topo)")


def _option(args: list, flag: str):
    if flag in args:
        i = args.index(flag)
        if i + 1 < len(args):
            return args[i + 1]
    return None


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    profile, devices = _chips()
    if not args or args[0] in ("-h", "--help", "-v"):
        print(_usage() if not args or args[0] != "-v" else f"npu-smi version: {VERSION}")
        return 0
    if args[0] != "info":
        print(f"Error: unsupported command: {args[0]}\n{_usage()}", file=sys.stderr)
        return 1
    rest = args[1:]
    if not rest:
        print(_table(profile, devices))
        return 0
    if rest == ["-l"]:
        print(_list(profile, devices))
        return 0
    if rest == ["-m"]:
        print(_mapping(profile, devices))
        return 0
    kind = _option(rest, "-t")
    npu, chip = _option(rest, "-i"), _option(rest, "-c")
    if kind == "topo":
        print(_topo(profile, devices))
        return 0
    if kind in ("board", "health") and npu is not None:
        try:
            npu_id, chip_id = int(npu), None if chip is None else int(chip)
        except ValueError:
            print("Error: invalid id", file=sys.stderr)
            return 1
        if kind == "health":
            if not any(n == npu_id for n, _, _ in _layout(profile, devices)):
                print(f"Error: NPU {npu_id} does not exist.", file=sys.stderr)
                return 1
            print(_field("Health Status", "OK") + "\n" + _field("Error Code", "NA"))
            return 0
        text = _board(profile, devices, npu_id, chip_id)
        if text is None:
            print(f"Error: NPU {npu_id} does not exist." if chip_id is None else
                  f"Error: Chip {chip_id} of NPU {npu_id} does not exist.", file=sys.stderr)
            return 1
        print(text)
        return 0
    print(f"Error: unsupported option: {' '.join(rest)}\n{_usage()}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
