"""`denpex fabric snapshot|check` as a user runs it: golden files written and compared,
differences printed with device paths, exit status 0/1/2."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from denpex.cli import fabric
from denpex.cli.main import UsageError, build_parser

FIXTURES = Path(__file__).resolve().parents[1] / "fabric" / "fixtures"
TOPO = FIXTURES / "nccl_topo"
GOLDEN = str(TOPO / "golden_dgx_h100.xml")


def denpex_fabric(*args: str, capsys) -> tuple[int, str, str]:
    """The subcommand in-process, with main()'s handling of usage errors."""
    parser = argparse.ArgumentParser(prog="denpex")
    fabric.add_parser(parser.add_subparsers(dest="command"))
    parsed = parser.parse_args(["fabric", *args])
    try:
        code = parsed.handler(parsed)
    except UsageError as exc:
        print(f"denpex fabric: {exc}", file=sys.stderr)
        code = 2
    out, err = capsys.readouterr()
    return code, out, err


def test_snapshot_of_a_dump_is_the_golden(capsys, tmp_path: Path) -> None:
    code, out, _ = denpex_fabric(
        "snapshot", "--nccl-topo", str(TOPO / "dgx_h100.xml"), capsys=capsys
    )
    assert code == 0 and out == Path(GOLDEN).read_text()
    target = tmp_path / "golden.xml"
    code, out, _ = denpex_fabric(
        "snapshot", "--nccl-topo", str(TOPO / "dgx_h100.xml"), "-o", str(target), capsys=capsys
    )
    assert code == 0 and out == "" and target.read_text() == Path(GOLDEN).read_text()


def test_check_prints_each_difference_with_its_path(capsys) -> None:
    code, out, _ = denpex_fabric(
        "check",
        "--golden",
        GOLDEN,
        "--nccl-topo",
        str(TOPO / "dgx_h100_gpu_moved.xml"),
        capsys=capsys,
    )
    assert code == 1
    lines = out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(
        "cpu 0 / pci 0000:15:00.0 / gpu 0000:2a:00.0: GPU 0000:2a:00.0 sits behind"
    )
    assert "met at pci 0000:27:00.0 in the golden, now at cpu 0" in lines[1]
    code, out, err = denpex_fabric(
        "check", "--golden", GOLDEN, "--nccl-topo", str(TOPO / "dgx_h100.xml"), capsys=capsys
    )
    assert (code, out) == (0, "") and "matches" in err


def test_check_json(capsys) -> None:
    code, out, _ = denpex_fabric(
        "check",
        "--golden",
        GOLDEN,
        "--nccl-topo",
        str(TOPO / "dgx_h100_nic_200g.xml"),
        "--json",
        capsys=capsys,
    )
    data = json.loads(out)
    assert code == 1 and [d["kind"] for d in data["differences"]] == ["nic_speed_lower"]
    assert data["differences"][0]["path"].endswith("nic 0000:5c:00.0 / net mlx5_3:1")


def test_sysfs_snapshot_and_check(capsys, tmp_path: Path) -> None:
    tree = FIXTURES / "gpudirect_good"
    roots = ["--sysfs", str(tree / "sys"), "--procfs", str(tree / "proc")]
    code, out, _ = denpex_fabric("snapshot", *roots, capsys=capsys)
    assert code == 0 and '<system version="1" source="sysfs">' in out
    golden = tmp_path / "golden.xml"
    golden.write_text(out)
    assert denpex_fabric("check", "--golden", str(golden), *roots, capsys=capsys)[0] == 0
    golden.write_text(out.replace('speed="400000"', 'speed="800000"', 1))
    code, out, _ = denpex_fabric("check", "--golden", str(golden), *roots, capsys=capsys)
    assert code == 1 and "net mlx5_0:1 runs at 400000 Mb/s; the golden at 800000 Mb/s" in out


@pytest.mark.parametrize(
    "args",
    [
        ["check", "--golden", "/nonexistent/golden.xml", "--nccl-topo", GOLDEN],
        ["check", "--golden", GOLDEN, "--nccl-topo", str(Path(__file__))],
        ["snapshot", "--sysfs", "/nonexistent-sysfs"],
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], capsys) -> None:
    code, out, err = denpex_fabric(*args, capsys=capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1


def test_help_has_examples(capsys) -> None:
    with pytest.raises(SystemExit):
        denpex_fabric("check", "--help", capsys=capsys)
    out = capsys.readouterr().out
    assert "denpex fabric snapshot --nccl-topo" in out and "exit status" in out


def test_fabric_is_a_subcommand_of_denpex() -> None:
    assert re.search(r"^ +fabric +", build_parser().format_help(), re.MULTILINE)


def test_through_the_denpex_command() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "denpex",
            "fabric",
            "check",
            "--golden",
            GOLDEN,
            "--nccl-topo",
            str(TOPO / "dgx_h100_nvlink_missing.xml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert "gpu 0000:3a:00.0: GPU 0000:3a:00.0 has no NVLink to 0000:07:00.0" in result.stdout
