"""The `nccl_topo` collector: reads the topology files jobs dump with NCCL_TOPO_DUMP_FILE,
counts what NCCL saw and reports each difference from the SKU's golden profile as evidence.
Also tells the control plane each GPU's rail (rails.py) from the newest dump, as the
agent's `host_rail` series. Reads only the files it is given, bounded in size; never runs
or changes NCCL.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from typing import Any

from denpex.core.collector import CollectContext, Observation
from denpex.core.events import Evidence
from denpex.core.roots import Roots
from denpex.fabric.base import FabricCollector
from denpex.fabric.nccl_topo.diff import Difference, compare_topologies
from denpex.fabric.nccl_topo.model import MAX_XML_BYTES, Topology, TopologyError, parse_topology
from denpex.fabric.nccl_topo.rails import GpuRail, gpu_rails

MAX_FILES = 64
# difference kind → its detector (denpex/core/detectors.yaml). NCCL lists only ACTIVE
# ports, so a missing net is a port down; a GPU–NIC pair split across switches sends
# GPUDirect RDMA through the root complex (or NCCL turns GDR off for it): a P2P path fault.
DETECTORS = {
    "pair_split": "gpu.p2p_topology.nccl_topo_pair_split",
    "gpu_moved": "gpu.p2p_topology.nccl_topo_gpu_moved",
    "nic_moved": "gpu.p2p_topology.nccl_topo_nic_moved",
    "gdr_off": "gpu.p2p_topology.nccl_topo_gdr_off",
    "gpu_missing": "gpu.fallen_off_bus.nccl_topo_gpu_missing",
    "gpu_extra": "gpu.p2p_topology.nccl_topo_gpu_extra",
    "gpu_sm": "gpu.p2p_topology.nccl_topo_gpu_sm",
    "cpu_missing": "gpu.p2p_topology.nccl_topo_cpu_missing",
    "cpu_extra": "gpu.p2p_topology.nccl_topo_cpu_extra",
    "nvlink_missing": "gpu.nvlink.nccl_topo_nvlink_missing",
    "nvlink_fewer": "gpu.nvlink.nccl_topo_nvlink_fewer",
    "nvlink_extra": "gpu.nvlink.nccl_topo_nvlink_extra",
    "nic_missing": "net.link_down.nccl_topo_nic_missing",
    "nic_extra": "net.link_down.nccl_topo_nic_extra",
    "nic_speed_lower": "net.link_down.nccl_topo_nic_speed_lower",
    "nic_speed_higher": "net.link_down.nccl_topo_nic_speed_higher",
    "pci_link_lower": "host.pcie_error.nccl_topo_pci_link_lower",
    "c2c_lower": "gpu.nvlink.nccl_topo_c2c_lower",
    "pcilink_missing": "gpu.p2p_topology.nccl_topo_pcilink_missing",
    "nic_rail_changed": "net.link_down.nccl_topo_nic_rail_changed",
}

HELP = {
    "nccl_topo_valid": "1 when the NCCL topology dump parsed (label file)",
    "nccl_topo_gpus": "GPUs in the NCCL topology dump",
    "nccl_topo_nics": "Network ports (net devices) in the NCCL topology dump",
    "nccl_topo_nvlinks": "NVLinks (summed link counts) in the NCCL topology dump",
    "nccl_topo_differences": "Differences of the dump from the golden profile",
}


def read_topology(path: str, limit: int = MAX_XML_BYTES) -> Topology:
    """Parse one topology file; TopologyError (naming the file) when absent or invalid."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise TopologyError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise TopologyError(f"{path} is larger than {limit} bytes")
    try:
        return parse_topology(data)
    except TopologyError as exc:
        raise TopologyError(f"{path}: {exc}") from None


class NcclTopoCollector(FabricCollector):
    name = "nccl_topo"
    stability = "experimental"
    default_interval_s = 300.0
    default_budget_s = 2.0
    metrics_help = HELP

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(roots, options)
        self._parsed: dict[str, tuple[tuple[float, int], Topology | None]] = {}
        self._golden: tuple[tuple[float, int], Topology] | None = None
        self._rails: list[GpuRail] = []

    def _patterns(self) -> list[str]:
        value = self.options.get("dump_files") or []
        return [value] if isinstance(value, str) else [str(v) for v in value]

    def available(self) -> tuple[bool, str]:
        if not self._patterns():
            return False, (
                "no dump_files set: point collectors.nccl_topo.dump_files at the file(s) jobs "
                "write with NCCL_TOPO_DUMP_FILE (paths or globs)"
            )
        golden = self.options.get("golden")
        if golden:
            try:
                read_topology(str(golden))
            except TopologyError as exc:
                return False, f"golden profile unusable: {exc}"
        what = f"compared with {golden}" if golden else "counted (no golden profile set)"
        return True, f"NCCL topology dumps {', '.join(self._patterns())}, {what}"

    def _files(self) -> list[str]:
        found: set[str] = set()
        for pattern in self._patterns():
            found.update(glob.glob(os.path.expanduser(pattern)))
        return sorted(found)[:MAX_FILES]

    def _load(self, path: str) -> Topology | None:
        """The file's topology, parsed again only when its mtime or size changed."""
        try:
            stat = os.stat(path)
        except OSError:
            return None
        stamp = (stat.st_mtime, stat.st_size)
        cached = self._parsed.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            topology: Topology | None = read_topology(
                path, int(self.options.get("max_file_bytes", MAX_XML_BYTES))
            )
        except TopologyError:
            topology = None
        self._parsed[path] = (stamp, topology)
        return topology

    def _golden_topology(self) -> Topology | None:
        golden = self.options.get("golden")
        if not golden:
            return None
        try:
            stat = os.stat(golden)
            stamp = (stat.st_mtime, stat.st_size)
            if self._golden is None or self._golden[0] != stamp:
                self._golden = (stamp, read_topology(str(golden)))
        except (OSError, TopologyError):
            return None
        return self._golden[1]

    def collect(self, ctx: CollectContext) -> list[Observation]:
        golden = self._golden_topology()
        out: list[Observation] = []
        found: dict[tuple[str, str, str], Evidence] = {}
        newest: tuple[float, Topology] | None = None
        for path in self._files():
            topology = self._load(path)
            if topology is not None:
                mtime = self._parsed[path][0][0]
                if newest is None or mtime > newest[0]:
                    newest = (mtime, topology)
            labels = {"file": path}
            out.append(self.metric_event(ctx, "nccl_topo_valid", int(topology is not None), labels))
            if topology is None:
                continue
            out.append(self.metric_event(ctx, "nccl_topo_gpus", len(topology.gpus), labels))
            out.append(self.metric_event(ctx, "nccl_topo_nics", len(topology.nets), labels))
            out.append(self.metric_event(ctx, "nccl_topo_nvlinks", topology.nvlink_count(), labels))
            if golden is None:
                continue
            differences = compare_topologies(
                golden, topology, allow_subset=bool(self.options.get("allow_gpu_subset", True))
            )
            out.append(self.metric_event(ctx, "nccl_topo_differences", len(differences), labels))
            for difference in differences:
                key = (path, difference.kind, difference.device)
                found[key] = self._evidence(ctx, path, difference)
        # each difference is evidence once while it lasts (a dump is read every poll)
        fresh = self.edges.holding("differences", found)
        self._rails = gpu_rails(newest[1]) if newest is not None else []
        out += [e for key, e in found.items() if key in fresh]
        return out

    def host_links(self) -> list[tuple[str, Mapping[str, str]]]:
        """Each GPU's rail and NIC port, from the newest dump the last poll read."""
        return [("rail", rail.labels()) for rail in self._rails]

    def _evidence(self, ctx: CollectContext, path: str, difference: Difference) -> Evidence:
        return self.finding(
            ctx,
            DETECTORS[difference.kind],
            attrs={"device": difference.device, "path": difference.path, "file": path},
            captures={
                "kind": difference.kind,
                "device": difference.device,
                "path": difference.path,
                "expected": difference.expected,
                "actual": difference.actual,
                "file": path,
            },
            values={"difference": difference.describe()},
        )
