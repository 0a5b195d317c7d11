"""The harness of the NVML collector tests: the real pynvml loads the fake libnvidia-ml.so.1
(compiled from the shipped C sources) in a fresh subprocess per scenario, the real collector
polls it after each pause, and the report comes back as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

from denpex.gpu.nvml.scenario import SCENARIO_ENV, compile_scenario, write_lines

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "scenarios"

DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from denpex.core.collector import CollectContext
    from denpex.core.events import Evidence
    from denpex.core.roots import Roots
    from denpex.gpu.nvml.collector import NvmlCollector

    options, pauses = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    roots = Roots(procfs=sys.argv[3]) if len(sys.argv) > 3 else Roots()
    collector = NvmlCollector(roots, options)
    report = {"available": collector.available(), "polls": []}
    for pause in pauses:
        time.sleep(pause)
        started = time.monotonic()
        found = collector.collect(CollectContext(roots, "node7"))
        poll = {"duration_s": time.monotonic() - started, "degraded": collector.degraded(),
                "evidence": [], "metrics": [], "events": []}
        for item in found:
            if isinstance(item, Evidence):
                poll["evidence"].append({"signature": item.signature, "category": item.category,
                    "severity": item.severity, "summary": item.summary, "captures": item.captures,
                    "host": item.event.host, "ts_ns": item.event.ts_ns, "action": item.action})
            elif item.kind == "metric":
                poll["metrics"].append({"name": item.body, "attrs": item.attrs, "pid": item.pid,
                                        "host": item.host, "ts_ns": item.ts_ns})
            else:
                poll["events"].append(item.body)
        report["polls"].append(poll)
    report["unsupported"] = {i: sorted(r.unsupported) for i, r in collector._readers.items()}
    report["facts"] = dict(collector.host_facts())
    collector.close()
    print(json.dumps(report))
    sys.stdout.flush()
    import os; os._exit(0)  # a deliberately hung NVML call must not hold up interpreter exit
    """
)
FAST = {"deadline_s": 0.5, "event_wait_ms": 100, "first_drain_s": 1.0}


def run_scenario(
    library: Path,
    tmp_path: Path,
    scenario: dict[str, Any],
    pauses: list[float],
    options: dict | None = None,
    procfs: Path | None = None,
) -> dict[str, Any]:
    """Poll the collector after each pause (seconds) in a fresh process, the fake library found
    by name through LD_LIBRARY_PATH as the real driver's would be."""
    lines = write_lines(compile_scenario(scenario), tmp_path / "scenario.txt")
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(library.parent),
        SCENARIO_ENV: str(lines),
        "PYTHONPATH": str(REPO),
    }
    env.pop("DENPEX_NVML_SHIM", None)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            DRIVER,
            json.dumps({**FAST, **(options or {})}),
            json.dumps(pauses),
            *([str(procfs)] if procfs else []),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def metric_value(poll: dict, name: str, gpu: str, **labels: str) -> float | None:
    for m in poll["metrics"]:
        if (
            m["name"] == name
            and m["attrs"].get("gpu") == gpu
            and all(m["attrs"].get(k) == v for k, v in labels.items())
        ):
            return m["attrs"]["value"]
    return None


def example(name: str) -> dict[str, Any]:
    """A scenario of examples/scenarios, parsed."""
    return yaml.safe_load((EXAMPLES / name).read_text())


def evidence(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for poll in report["polls"] for e in poll["evidence"]]
