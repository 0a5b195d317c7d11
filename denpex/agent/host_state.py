"""What this node tells the control plane of itself beyond its evidence: `host_info` (value
1) labelled with its shared dependencies (the GPU driver and firmware from NVML / DCGM, the
kernel release from procfs), and the time its GPU diagnostics last passed
(`diagnostics_last_pass_timestamp_seconds`), and where it sits in the fabric: its leaf switch
as UFM sees it (`host_placement`), each GPU's rail and NIC port (`host_rail`, from the NCCL
topology) and the switch port each RDMA port is cabled to (`host_port_peer`, from
ibnetdiscover / iblinkinfo / LLDP). The fleet rules read all of them (fleet_wide names a
driver or kernel rollout by these labels; recovered clears a host whose diagnostics passed).

The last pass is kept in `<state_dir>/diagnostics.json`, written by `denpex agent diag`
(DCGM's diagnostic) or by a site's own tool in the same form ({"passed_ns", "level",
"tool"}). Never runs a diagnostic or calls a library itself: the facts come from the
collectors' last polls (Collector.host_facts) and from files.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from denpex.core import jsonio
from denpex.core.collector import Collector
from denpex.core.events import Event, metric
from denpex.core.roots import Roots, read_text

INFO_METRIC = "host_info"
PLACEMENT_METRIC = "host_placement"
# facts that place the host in the fabric (UFM: the leaf switch its HCAs reach), sent as
# `host_placement` labels; the control plane merges them with the site topology file
PLACEMENT_FACTS = ("switch", "switch_guid", "rack", "pdu", "pool")
# one series per GPU / per port, all stamped alike each time: the control plane reads the
# newest stamp of each as the host's whole snapshot, so a port recabled or gone drops out
LINK_METRICS = {"rail": "host_rail", "port": "host_port_peer"}
DIAGNOSTICS_METRIC = "diagnostics_last_pass_timestamp_seconds"
DIAGNOSTICS_FILE = "diagnostics.json"
HELP = {
    INFO_METRIC: "1, labelled with the host's driver, firmware and kernel versions",
    PLACEMENT_METRIC: "1, labelled with where the host sits in the fabric (its leaf switch)",
    "host_rail": "1 per GPU, labelled with its NIC port and rail (NCCL topology)",
    "host_port_peer": "1 per RDMA port, labelled with the switch port it is cabled to",
    DIAGNOSTICS_METRIC: "Unix time at which this host's GPU diagnostics last passed",
}
# where a label would come from, when no running collector gives it
WITHOUT = {
    "driver": "no NVML or DCGM collector runs here",
    "firmware": "no NVML collector runs here (DCGM does not report the VBIOS)",
}


def kernel_release(roots: Roots) -> str:
    """The running kernel's release (`/proc/sys/kernel/osrelease` under the procfs root)."""
    return (read_text(roots.proc("sys/kernel/osrelease")) or "").strip()


def collector_facts(collectors: Iterable[Collector]) -> dict[str, str]:
    """Every running collector's facts; the first to name one wins, in registry order
    (NVML before DCGM)."""
    facts: dict[str, str] = {}
    for collector in collectors:
        try:
            found = collector.host_facts()
        except Exception:  # a collector's bug must not take the others' facts away
            continue
        for key, value in found.items():
            if value:
                facts.setdefault(key, value)
    return facts


def host_placement(collectors: Iterable[Collector]) -> dict[str, str]:
    """The labels of `host_placement`: the placement facts only."""
    facts = collector_facts(collectors)
    return {k: facts[k] for k in PLACEMENT_FACTS if k in facts}


def host_links(collectors: Iterable[Collector]) -> list[tuple[str, dict[str, str]]]:
    """(metric, labels) of every running collector's fabric rows (Collector.host_links);
    one row per GPU or port, the first collector to name it winning."""
    out: list[tuple[str, dict[str, str]]] = []
    seen: set[tuple[str, str]] = set()
    for collector in collectors:
        try:
            rows = list(collector.host_links())
        except Exception:  # a collector's bug must not take the others' rows away
            continue
        for kind, labels in rows:
            name = LINK_METRICS.get(kind)
            subject = labels.get("gpu") or labels.get("port") or ""
            if name is None or (kind, subject) in seen:
                continue
            seen.add((kind, subject))
            out.append((name, {str(k): str(v) for k, v in labels.items()}))
    return out


def host_labels(collectors: Iterable[Collector], roots: Roots) -> dict[str, str]:
    """The labels of `host_info`: the collectors' facts that are not placement, and the
    kernel release."""
    facts = collector_facts(collectors)
    labels = {k: v for k, v in facts.items() if k not in PLACEMENT_FACTS}
    kernel = kernel_release(roots)
    if kernel:
        labels["kernel"] = kernel
    return labels


def missing(labels: Mapping[str, str]) -> dict[str, str]:
    """Which of the labels the rules use are absent here, and why (for /healthz)."""
    out = {k: why for k, why in WITHOUT.items() if k not in labels}
    if "kernel" not in labels:
        out["kernel"] = "procfs has no sys/kernel/osrelease"
    return out


def record_diagnostics(state_dir: Path, *, level: int, tool: str, passed: bool) -> None:
    """Keep a diagnostic's outcome: a pass moves `passed_ns`, any run moves `ran_ns`."""
    now = time.time_ns()
    current = last_diagnostics(state_dir) or {}
    data: dict[str, Any] = {**current, "ran_ns": now, "last_verdict": "pass" if passed else "fail"}
    if passed:
        data.update(passed_ns=now, level=level, tool=tool)
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / DIAGNOSTICS_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(jsonio.dumps(data))
    os.replace(tmp, path)


def last_diagnostics(state_dir: Path) -> dict[str, Any] | None:
    """The recorded outcome, or None when nothing was recorded or the file is unreadable."""
    try:
        data = jsonio.loads((state_dir / DIAGNOSTICS_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def host_state_metrics(
    collectors: Iterable[Collector], roots: Roots, state_dir: Path, host: str, now_ns: int
) -> list[Event]:
    """`host_info`, `host_placement` when a collector knows where the host sits, the rows of
    `host_rail` / `host_port_peer` the fabric collectors found, and, once
    a diagnostic passed here, the time it did."""
    collectors = list(collectors)
    labels = host_labels(collectors, roots)
    out = [metric(INFO_METRIC, 1, source="agent", labels=labels, host=host, ts_ns=now_ns)]
    placement = host_placement(collectors)
    if placement:
        out.append(
            metric(PLACEMENT_METRIC, 1, source="agent", labels=placement, host=host, ts_ns=now_ns)
        )
    for name, labels in host_links(collectors):
        out.append(metric(name, 1, source="agent", labels=labels, host=host, ts_ns=now_ns))
    passed = (last_diagnostics(state_dir) or {}).get("passed_ns")
    if isinstance(passed, int) and passed > 0:
        out.append(
            metric(DIAGNOSTICS_METRIC, passed / 1e9, source="agent", host=host, ts_ns=now_ns)
        )
    return out
