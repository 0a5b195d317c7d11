"""`denpex agent` from the command line: one collection, and the errors a person sees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "host" / "fixtures"


def denpex(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "denpex", *args], capture_output=True, text=True, timeout=120
    )


def test_once_json_reads_a_fixture_tree_through_the_roots():
    tree = FIXTURES / "psi"
    result = denpex(
        *("agent", "--once", "--json", "--collectors", "psi", "--host", "node9"),
        *("--procfs", str(tree / "proc"), "--sysfs", str(tree / "sys")),
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["host"] == "node9"
    values = {
        (e["body"], e["attrs"].get("resource"), e["attrs"].get("scope")): e["attrs"]["value"]
        for e in data["events"]
        if e["kind"] == "metric"
    }
    assert values[("psi_full_avg10_ratio", "memory", "host")] > 0
    assert all(e["host"] == "node9" for e in data["events"])
    assert data["unavailable"]["kmsg"] == "disabled in the configuration"


def test_once_text_lists_metrics_and_what_is_unavailable():
    result = denpex(
        "agent", "--once", "--collectors", "psi,journal", "--procfs", str(FIXTURES / "psi" / "proc")
    )
    assert result.returncode == 0, result.stderr
    assert "psi_some_avg10_ratio{resource=cpu,scope=host}" in result.stdout
    assert "unavailable here:\n  journal: " in result.stdout
    assert "kmsg" not in result.stdout  # left out on purpose: not reported as unavailable
    assert "[warning] train.straggler: cpu pressure" in result.stdout  # the fixture's PSI


def test_usage_errors_are_one_line_with_exit_status_2(tmp_path):
    bad = tmp_path / "agent.yaml"
    bad.write_text("spool: {fsync: sometimes}\ncollectors: {kmsgg: {}}\n")
    for args, expected in [
        (("agent", "--json"), "--json goes with --once"),
        (("agent", "--once", "--collectors", "psy"), "unknown psy"),
        (("agent", "--once", "--config", str(bad)), "collectors.kmsgg: no such collector"),
        (("agent", "--listen", "nowhere"), "expected HOST:PORT"),
    ]:
        result = denpex(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert expected in result.stderr and "Traceback" not in result.stderr
