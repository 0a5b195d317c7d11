"""`denpex run`'s text report says how much of the output analysis skipped, when it had to.

A real run (run_command, the analyzer process, a real LiteSession with its catalog) with a
64 KiB ring and no spill behind a job printing 15 MB at once: the analyzer is still loading
its catalog while the ring overflows, so it drops, and the text report's warning must say
how much and what share, the same number as the JSON report's stats.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNER = """
import sys
from denpex.catalog import load_catalog
from denpex.lite.runner import run_command
from denpex.lite.session import LiteSession, ReportOptions

report, spill = sys.argv[1], int(sys.argv[2])
def factory(child_pid):
    options = ReportOptions(report_path=report, color=False)
    return LiteSession.for_run(load_catalog(), options, child_pid, None)
job = [sys.executable, "-c", "import os; [os.write(1, b'step 1 loss 2.0 ok\\\\n' * 50000) "
       "for _ in range(16)]"]
sys.exit(run_command(job, use_pty=False, session_factory=factory, ring_bytes=64 << 10,
                     spill_bytes=spill))
"""


def _run(tmp_path: Path, spill: int) -> tuple[str, dict]:
    report = tmp_path / f"report{spill}.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(report), str(spill)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return " ".join(proc.stderr.decode().split()), json.loads(report.read_text())["stats"]


def test_the_text_report_says_how_much_analysis_skipped(tmp_path: Path) -> None:
    text, stats = _run(tmp_path, spill=0)
    dropped, relayed = stats["dropped_analysis_bytes"], stats["relayed_bytes"]
    assert relayed == 16 * 50000 * 19 and 0 < dropped < relayed
    found = re.search(r"analysis skipped (\d+\.\d) MB of output \((\d+\.\d)% of 15\.2 MB;", text)
    assert found, text[-1500:]
    assert abs(float(found.group(1)) - dropped / 1e6) <= 0.05
    assert abs(float(found.group(2)) - 100 * dropped / relayed) <= 0.05
    assert "nothing dropped" not in text


def test_with_the_spill_nothing_is_skipped(tmp_path: Path) -> None:
    text, stats = _run(tmp_path, spill=1 << 30)
    assert stats["dropped_analysis_bytes"] == 0 and stats["spilled_analysis_bytes"] > 0
    assert stats["bytes"] == stats["relayed_bytes"] == 16 * 50000 * 19
    assert "analysis skipped" not in text and "no failure found" in text
