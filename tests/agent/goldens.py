"""Golden files of the agent's whole outputs, as node_exporter keeps `e2e-output.txt`: the
/metrics page and the OTLP metrics and logs payloads (JSON form), built by the real
collectors from the fixture trees of tests/host and tests/fabric and from the fake NVML
library's scenario, at a fixed clock and host name. A change to a metric's name, labels or
HELP text, or to an evidence's fields, shows as a diff of tests/agent/goldens/.

Regenerate after an intended change, then review the diff like code:

    python -m tests.agent.goldens --update

Without --update the command prints the differences and exits 1 (what the test checks).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from denpex import __version__
from denpex.agent.exposition import AgentView, render
from denpex.agent.jobs import JobTable
from denpex.agent.otlp import encode_logs, encode_metrics, serialise
from denpex.agent.pipeline import Pipeline
from denpex.agent.registry import COLLECTORS
from denpex.agent.scheduler import CollectorState
from denpex.catalog import load_catalog
from denpex.core.collector import CollectContext, Collector, Observation
from denpex.core.events import Event, Evidence
from denpex.core.roots import Roots
from denpex.core.wire import Registration, event_from_dict, evidence_from_dict
from denpex.fabric.gpudirect import GpuDirectCollector
from denpex.fabric.ib.collector import IbCollector
from denpex.fabric.nccl_topo.collector import NcclTopoCollector
from denpex.fabric.roce.collector import RoceCollector
from denpex.gpu.nvml.scenario import SCENARIO_ENV, build_fake_library, compile_scenario, write_lines
from denpex.host.cgroup import CgroupCollector
from denpex.host.numa import NumaCollector
from denpex.host.pcie import PcieCollector
from denpex.host.proc import ProcCollector
from denpex.host.psi import PsiCollector

REPO = Path(__file__).resolve().parents[2]
GOLDEN_DIR = Path(__file__).parent / "goldens"
HOST_FIXTURES = REPO / "tests" / "host" / "fixtures"
FABRIC_FIXTURES = REPO / "tests" / "fabric" / "fixtures"
HOST = "golden-node"
S = 1_000_000_000
NOW_NS = 1_790_000_000 * S
START_NS = NOW_NS - 3600 * S  # the counters' start time in OTLP
UPDATE_COMMAND = "python -m tests.agent.goldens --update"

# A healthy GPU and one slowed by heat, with no timeline: every poll reads the same values.
NVML_SCENARIO = {
    "description": "golden: two GPUs, GPU 1 thermally slowed",
    "gpus": 2,
    "defaults": {"utilization_gpu": 90, "temperature_c": 70, "sm_clock_mhz": 1980},
    "gpu": {1: {"temperature_c": 91, "margin_temperature_c": 2, "clocks_event_reasons": 96}},
}
NVML_DRIVER = """
import json, os, sys
from denpex.core.collector import CollectContext
from denpex.core.events import Evidence
from denpex.core.roots import Roots
from denpex.core.wire import event_to_dict, evidence_to_dict
from denpex.gpu.nvml.collector import NvmlCollector

collector = NvmlCollector(Roots(), {"first_drain_s": 0.2})
found = collector.collect(CollectContext(Roots(), sys.argv[1], now_ns=int(sys.argv[2])))
out = []
for n, item in enumerate(found):
    if isinstance(item, Evidence):
        item.id = f"nvml-{n}"
        out.append({"evidence": evidence_to_dict(item)})
    else:
        out.append({"event": event_to_dict(item)})
collector.close()
print(json.dumps(out))
sys.stdout.flush()
os._exit(0)
"""


def _tree(folder: Path) -> Roots:
    return Roots(procfs=str(folder / "proc"), sysfs=str(folder / "sys"), devfs=str(folder / "dev"))


def _poll(collector: Collector, roots: Roots, jobs: list[Registration]) -> list[Observation]:
    return collector.collect(CollectContext(roots=roots, host=HOST, jobs=jobs, now_ns=NOW_NS))


def host_observations() -> list[tuple[Collector, list[Observation]]]:
    """The host collectors over tests/host/fixtures (each fixture as its tests use it)."""
    v2, v1 = _tree(HOST_FIXTURES / "cgroup_v2"), _tree(HOST_FIXTURES / "cgroup_v1")
    psi, proc = _tree(HOST_FIXTURES / "psi"), _tree(HOST_FIXTURES / "proc")
    numa, pcie = _tree(HOST_FIXTURES / "numa_2node"), _tree(HOST_FIXTURES / "pcie")
    pod = Registration(pid=5001, job="pod-job", rank=0, tenant="t1")
    slurm = Registration(pid=7001, job="j7", cgroup="/slurm/uid_0/job_7")
    train = Registration(pid=4242, job="train-42", rank=3, tenant="team-a")
    cgroup = CgroupCollector(v2)
    runs: list[tuple[Collector, list[Observation]]] = [
        (cgroup, _poll(cgroup, v2, [pod])),
        (cgroup, _poll(CgroupCollector(v1), v1, [slurm])),
        (PsiCollector(psi), _poll(PsiCollector(psi), psi, [train])),
        (ProcCollector(proc), _poll(ProcCollector(proc), proc, [Registration(pid=100, job="p")])),
        (NumaCollector(numa), _poll(NumaCollector(numa), numa, [Registration(pid=300, job="n")])),
        (PcieCollector(pcie), _poll(PcieCollector(pcie), pcie, [])),
    ]
    return runs


def fabric_observations() -> list[tuple[Collector, list[Observation]]]:
    """The fabric collectors over tests/fabric/fixtures, paths given relative to that folder
    so that no machine's path reaches a label."""
    with contextlib.chdir(FABRIC_FIXTURES):
        ib_roots = Roots(sysfs="ib_node/sys")
        roce_roots = Roots(sysfs="roce_node/sys")
        gpudirect = _tree(Path("gpudirect_bad"))
        ib = IbCollector(ib_roots, {"full_counters_every": 1})
        roce = RoceCollector(roce_roots, {"ethtool_command": ["sh", "roce_node/ethtool.sh"]})
        topo = NcclTopoCollector(
            Roots(),
            {
                "dump_files": ["nccl_topo/dgx_h100_nvlink_missing.xml"],
                "golden": "nccl_topo/golden_dgx_h100.xml",
            },
        )
        direct = GpuDirectCollector(gpudirect)
        return [
            (ib, _poll(ib, ib_roots, [])),
            (roce, _poll(roce, roce_roots, [])),
            (topo, _poll(topo, Roots(), [])),
            (direct, _poll(direct, gpudirect, [])),
        ]


def nvml_observations(work: Path) -> list[Observation]:
    """One poll of the real NVML collector over the fake libnvidia-ml (a fresh process: the
    library is loaded once per process)."""
    library = build_fake_library(work)
    lines = write_lines(compile_scenario(NVML_SCENARIO), work / "scenario.txt")
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(library.parent),
        SCENARIO_ENV: str(lines),
        "PYTHONPATH": str(REPO),
    }
    result = subprocess.run(
        [sys.executable, "-c", NVML_DRIVER, HOST, str(NOW_NS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"the NVML poll failed: {result.stderr[-2000:]}")
    out: list[Observation] = []
    for item in json.loads(result.stdout):
        if "evidence" in item:
            out.append(evidence_from_dict(item["evidence"]))
        else:
            out.append(event_from_dict(item["event"]))
    return out


def _states(runs: list[tuple[Collector, list[Observation]]]) -> list[CollectorState]:
    """Self-metrics with fixed values: one state per collector, as after a first poll."""
    states: dict[str, CollectorState] = {}
    for collector, found in runs:
        state = states.setdefault(
            collector.name,
            CollectorState(collector, collector.default_interval_s, collector.default_budget_s),
        )
        state.polls_total += 1
        state.events_total += len(found)
        state.last_duration_s = 0.25
        state.cpu_seconds_total += 0.125
    return sorted(states.values(), key=lambda s: s.name)


def build(work: Path) -> dict[str, str]:
    """Every golden file's expected text, by file name."""
    from denpex.gpu.nvml.collector import NvmlCollector

    runs = [*host_observations(), *fabric_observations()]
    nvml = nvml_observations(work)
    runs.append((NvmlCollector(Roots()), nvml))
    pipeline = Pipeline(load_catalog(), JobTable(Roots()), host=HOST)
    metrics: list[Event] = []
    evidence: list[Evidence] = []
    for _, found in runs:
        pipeline.ingest(found)
        metrics += [e for e in found if isinstance(e, Event) and e.kind == "metric"]
        evidence += [e for e in found if isinstance(e, Evidence)]
    for n, item in enumerate(evidence, 1):
        item.id = f"e{n}"  # the pipeline's ids carry a pid and a start time
    helps: dict[str, str] = {}
    for cls in COLLECTORS:
        helps.update(cls.metrics_help)
    states = _states(runs)
    view = AgentView(
        host=HOST,
        pipeline=pipeline,
        states=lambda: states,
        unavailable=lambda: {"ebpf": "not in the golden run"},
        help_texts=lambda: helps,
    )
    page = render(view).decode().replace(f'version="{__version__}"', 'version="VERSION"')
    otlp_metrics = encode_metrics(metrics, now_ns=NOW_NS, start_ns=START_NS, helps=helps)
    otlp_logs = encode_logs(evidence, observed_ns=NOW_NS)
    return {
        "metrics.txt": page,
        "otlp_metrics.json": _pretty(serialise(otlp_metrics, "http/json")),
        "otlp_logs.json": _pretty(serialise(otlp_logs, "http/json")),
    }


def _pretty(data: bytes) -> str:
    """OTLP JSON with one line per data point, log record attribute or resource attribute
    (a reviewable diff), keys sorted."""
    return _layout(json.loads(data), "") + "\n"


def _layout(value: Any, indent: str) -> str:
    flat = json.dumps(value, sort_keys=True)
    if len(flat) + len(indent) <= 100 or not isinstance(value, dict | list) or not value:
        return flat
    inner = indent + " "
    if isinstance(value, list):
        items = [inner + _layout(v, inner) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    items = [f"{inner}{json.dumps(k)}: {_layout(v, inner)}" for k, v in sorted(value.items())]
    return "{\n" + ",\n".join(items) + "\n" + indent + "}"


def differences(built: dict[str, str]) -> list[str]:
    """A unified diff per golden file that differs from what was built."""
    problems = []
    for name, text in sorted(built.items()):
        path = GOLDEN_DIR / name
        old = path.read_text() if path.exists() else ""
        if old != text:
            diff = difflib.unified_diff(
                old.splitlines(True), text.splitlines(True), f"golden/{name}", f"built/{name}"
            )
            problems.append("".join(list(diff)[:200]))
    return problems


def leaked_paths(built: dict[str, str]) -> list[str]:
    """Golden files that would carry this machine's paths (they must not reach the repo)."""
    return [name for name, text in built.items() if str(REPO) in text or "/tmp/" in text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="rewrite the golden files")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="denpex-goldens-") as work:
        built = build(Path(work))
    leaked = leaked_paths(built)
    if leaked:
        print(f"machine paths in {', '.join(leaked)}: fix the fixture set-up", file=sys.stderr)
        return 1
    if args.update:
        GOLDEN_DIR.mkdir(exist_ok=True)
        for name, text in built.items():
            (GOLDEN_DIR / name).write_text(text)
        print(f"wrote {len(built)} golden files to {GOLDEN_DIR.relative_to(REPO)}")
        return 0
    problems = differences(built)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
