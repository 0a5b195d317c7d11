"""`denpex signatures …` and `denpex explain`: the catalog tools a user runs, and the
generated reference page kept current."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from denpex.catalog import load_catalog
from denpex.catalog.reference import render_markdown
from denpex.core import load_taxonomy

ROOT = Path(__file__).resolve().parents[2]
LOCAL = """\
- id: gpu.fallen_off_bus.xid79
  category: gpu.fallen_off_bus
  severity: critical
  regex: 'NVRM: Xid \\(PCI:(?P<pci>[0-9a-fA-F:.]{1,16})\\): 79\\b'
  summary: "Site rule: GPU {pci} fell off the bus; page the on-call"
  action: drain_node
  explain: "Our site's wording. Page the hardware on-call."
  refs: ["https://wiki.example/gpu"]
  examples:
    match: ["NVRM: Xid (PCI:0000:3b:00): 79, pid=1"]
    no_match: ["NVRM: Xid (PCI:0000:3b:00): 13, pid=1"]
- id: app.exception.site_custom_crash
  category: app.exception
  severity: error
  regex: 'OurTrainerCrash: (?P<what>[^\\n]{1,200})'
  summary: "The site trainer crashed: {what}"
  action: fix_code
  explain: "Our trainer's own crash marker. Read the lines above it."
  refs: ["https://wiki.example/trainer"]
  examples:
    match: ["OurTrainerCrash: optimizer state missing"]
    no_match: ["OurTrainer started"]
"""


def denpex(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "denpex", *args],
        capture_output=True,
        cwd=cwd,
        timeout=120,
        text=True,
    )


def test_list_json_and_filter():
    result = denpex("signatures", "list", "--json")
    entries = json.loads(result.stdout)
    assert result.returncode == 0 and len(entries) == len(load_catalog())
    assert {"id", "category", "severity", "regex", "examples"} <= set(entries[0])
    gpu = denpex("signatures", "list", "--category", "gpu.")
    assert gpu.returncode == 0 and all(
        ".xid" in line or "gpu." in line for line in gpu.stdout.splitlines()
    )
    assert denpex("signatures", "list", "--category", "nope.nope").returncode == 2


def test_show_and_explain():
    shown = denpex("signatures", "show", "gpu.fallen_off_bus.xid79")
    assert shown.returncode == 0 and "drain_node" in shown.stdout and "matches" in shown.stdout
    assert denpex("signatures", "show", "no.such.id").returncode == 2
    category = denpex("explain", "gpu.fallen_off_bus")
    assert category.returncode == 0 and "what to do" in category.stdout
    assert "gpu.fallen_off_bus.xid79" in category.stdout
    unknown = denpex("explain", "xid79")
    assert unknown.returncode == 2 and "did you mean" in unknown.stderr


def test_site_local_signatures_override_and_extend(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "ours.yaml").write_text(LOCAL)
    tested = denpex("signatures", "test", "--signatures-dir", str(tmp_path / "site"))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    shown = denpex(
        "signatures", "--signatures", str(tmp_path / "site"), "show", "gpu.fallen_off_bus.xid79"
    )
    assert "page the on-call" in shown.stdout and "overrides the shipped entry" in shown.stdout
    log = tmp_path / "job.log"
    log.write_text("OurTrainerCrash: optimizer state missing\n")
    scanned = denpex("scan", "--json", "-q", "--signatures", str(tmp_path / "site"), str(log))
    assert (
        json.loads(scanned.stdout)["root_cause"]["signature"] == "app.exception.site_custom_crash"
    )


def test_bad_site_signatures_are_reported_with_file_and_line(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "bad.yaml").write_text(LOCAL.replace("severity: error", "severity: loud"))
    tested = denpex("signatures", "test", "--signatures-dir", str(tmp_path / "site"))
    assert tested.returncode == 1
    assert "bad.yaml:14:" in tested.stdout and "severity" in tested.stdout
    scanned = denpex(
        "scan", "--signatures", str(tmp_path / "site"), str(tmp_path / "site" / "bad.yaml")
    )
    assert scanned.returncode == 2 and "bad.yaml:14:" in scanned.stderr


def test_reference_page_is_current():
    page = (ROOT / "docs" / "signatures.md").read_text()
    expected = render_markdown(load_catalog(), load_taxonomy())
    assert page == expected, "regenerate: denpex signatures docs --output docs/signatures.md"


def test_doctor_reports_backends_and_host_sources():
    result = denpex("doctor", "--json")
    assert result.returncode == 0
    checks = {c["check"]: c for c in json.loads(result.stdout)}
    assert {"backend matcher", "signatures", "kernel log", "memory cgroup"} <= set(checks)
    assert checks["signatures"]["ok"] and "loaded" in checks["signatures"]["detail"]
    # what the node agent can use here, every missing piece with its reason
    assert {"kernel", "BTF", "BPF privileges", "PSI", "cgroups", "NVML", "InfiniBand"} <= set(
        checks
    )
    collectors = {name for name in checks if name.startswith("collector ")}
    assert "collector kmsg" in collectors and "collector ebpf" in collectors
    assert all(checks[name]["detail"] for name in collectors)
