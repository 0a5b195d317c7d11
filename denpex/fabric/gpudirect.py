"""GPUDirect prerequisites: the peer-memory module (nvidia_peermem / nv_peer_mem), ACS
redirect bits on the PCIe bridges between GPUs and RDMA NICs, and the IOMMU mode: the usual
causes of gpu.p2p_topology failures. Reads sysfs/procfs and config space; never changes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import combinations
from typing import Any

from denpex.core.collector import CollectContext, Observation
from denpex.core.events import Event, Evidence, metric
from denpex.core.roots import read_text
from denpex.fabric.base import FabricCollector
from denpex.fabric.pci_sysfs import (
    HOST_BRIDGE,
    PciDevice,
    config_readable,
    iommu_group_type,
    list_devices,
    parse_acs,
    read_config,
)

PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")
DETECTORS = {
    "peermem_missing": "gpu.p2p_topology.peermem_missing",
    "acs_redirect": "gpu.p2p_topology.acs_redirect",
    "iommu_translated": "gpu.p2p_topology.iommu_translated",
}

HELP = {
    "gpudirect_peermem_loaded": "1 when nvidia_peermem or nv_peer_mem is loaded",
    "gpudirect_gpus": "NVIDIA GPUs on the PCI bus",
    "gpudirect_rdma_nics": "RDMA-capable NICs (InfiniBand, RoCE) on the PCI bus",
    "gpudirect_acs_redirect_bridges": "Bridges between GPUs/RDMA NICs with ACS P2P redirect on",
    "gpudirect_acs_unreadable_bridges": "Bridges between GPUs/RDMA NICs whose extended config "
    "space could not be read (needs root)",
    "gpudirect_iommu_translated": "1 when GPU/NIC DMA goes through IOMMU translation (label mode)",
}


def parse_modules(text: str) -> set[str]:
    """`<procfs>/modules` → the names of the loaded modules."""
    return {line.split()[0] for line in text.splitlines() if line.strip()}


def parse_cmdline(text: str) -> dict[str, str]:
    """`<procfs>/cmdline` → its key=value switches (a bare word maps to "")."""
    out = {}
    for word in text.replace("\0", " ").split():
        key, _, value = word.partition("=")
        out[key] = value
    return out


def iommu_mode(present: bool, group_types: Iterable[str | None], cmdline: Mapping[str, str]) -> str:
    """ "off", "passthrough", "translated" or "unknown": the per-group default domain
    decides; without groups the kernel command line (the default depends on the build)."""
    types = {t for t in group_types if t}
    if types & {"DMA", "DMA-FQ"}:
        return "translated"
    if types and types <= {"identity"}:
        return "passthrough"
    if not present:
        return "off"
    if cmdline.get("iommu") == "pt" or cmdline.get("iommu.passthrough") == "1":
        return "passthrough"
    if cmdline.get("iommu") == "off" or "off" in (
        cmdline.get("intel_iommu"),
        cmdline.get("amd_iommu"),
    ):
        return "off"
    if cmdline.get("iommu.passthrough") == "0" or cmdline.get("iommu") == "nopt":
        return "translated"
    return "unknown"


def bridges_between(devices: list[PciDevice], include_root_ports: bool) -> dict[str, set[str]]:
    """Bridge → the peer devices whose traffic crosses it: for every GPU–GPU and GPU–NIC pair
    under one host bridge, the bridges below their common point. Pairs across host bridges
    go through the CPU interconnect whatever ACS says, so they add nothing."""
    peers = [d for d in devices if d.kind in ("gpu", "rdma_nic")]
    found: dict[str, set[str]] = {}
    for a, b in combinations(peers, 2):
        if a.kind == b.kind == "rdma_nic" or a.chain[:1] != b.chain[:1]:
            continue
        common = 0
        while common < min(len(a.chain), len(b.chain)) - 1 and a.chain[common] == b.chain[common]:
            common += 1
        for device in (a, b):
            for depth, bridge in enumerate(device.chain[common:-1], start=common):
                is_root_port = depth == 1 and bool(HOST_BRIDGE.match(device.chain[0]))
                if HOST_BRIDGE.match(bridge) or (is_root_port and not include_root_ports):
                    continue
                found.setdefault(bridge, set()).update((a.bdf, b.bdf))
    return found


class GpuDirectCollector(FabricCollector):
    name = "gpudirect"
    stability = "experimental"
    default_interval_s = 300.0
    default_budget_s = 2.0
    metrics_help = HELP

    def available(self) -> tuple[bool, str]:
        folder = self.roots.sys("bus", "pci", "devices")
        if not folder.is_dir():
            return False, f"{folder} is missing (no PCI bus or sysfs not mounted)"
        return True, f"peer-memory module, ACS on bridges under {folder}, IOMMU mode"

    def collect(self, ctx: CollectContext) -> list[Observation]:
        devices = list_devices(ctx.roots)
        gpus = [d for d in devices if d.kind == "gpu"]
        nics = [d for d in devices if d.kind == "rdma_nic"]
        loaded = parse_modules(read_text(ctx.roots.proc("modules")) or "")
        peermem = sorted(
            m for m in PEERMEM_MODULES if m in loaded or ctx.roots.sys("module", m).is_dir()
        )
        out: list[Observation] = [
            self._metric(ctx, "gpudirect_peermem_loaded", 1 if peermem else 0),
            self._metric(ctx, "gpudirect_gpus", len(gpus)),
            self._metric(ctx, "gpudirect_rdma_nics", len(nics)),
        ]
        found: list[Evidence] = []
        if gpus and nics and not peermem:
            found.append(self._peermem_evidence(ctx, gpus, nics))
        between = bridges_between(devices, bool(self.options.get("acs_include_root_ports")))
        redirected = unreadable = 0
        for bridge in sorted(between):
            config = read_config(ctx.roots, bridge)
            if not config_readable(config):
                unreadable += 1
                continue
            acs = parse_acs(config)
            if acs is not None and acs.redirects():
                redirected += 1
                found.append(self._acs_evidence(ctx, bridge, acs.redirects(), between[bridge]))
        out.append(self._metric(ctx, "gpudirect_acs_redirect_bridges", redirected))
        out.append(self._metric(ctx, "gpudirect_acs_unreadable_bridges", unreadable))
        present = ctx.roots.sys("class", "iommu").is_dir() and any(
            ctx.roots.sys("class", "iommu").iterdir()
        )
        cmdline = parse_cmdline(read_text(ctx.roots.proc("cmdline")) or "")
        peers = gpus + nics
        mode = iommu_mode(present, (iommu_group_type(ctx.roots, d.bdf) for d in peers), cmdline)
        translated = mode == "translated"
        out.append(self._metric(ctx, "gpudirect_iommu_translated", int(translated), mode=mode))
        if translated and gpus and (nics or len(gpus) > 1):
            found.append(self._iommu_evidence(ctx, peers))
        return out + self._new_only(found)

    def _new_only(self, found: list[Evidence]) -> list[Observation]:
        """Each condition is evidence once while it lasts; it re-arms when it clears."""
        keys = {(e.signature, e.captures["device"]): e for e in found}
        fresh = self.edges.holding("findings", keys)
        return [e for key, e in keys.items() if key in fresh]

    def _metric(self, ctx: CollectContext, name: str, value: float, **labels: str) -> Event:
        return metric(name, value, source="pcie", labels=labels, host=ctx.host, ts_ns=ctx.now_ns)

    def _evidence(
        self,
        ctx: CollectContext,
        what: str,
        device: str,
        captures: dict[str, str],
        values: dict[str, Any],
    ) -> Evidence:
        return self.finding(
            ctx,
            DETECTORS[what],
            source="pcie",
            attrs={"device": device, "check": what},
            captures={"device": device, **captures},
            values=values,
        )

    def _peermem_evidence(
        self, ctx: CollectContext, gpus: list[PciDevice], nics: list[PciDevice]
    ) -> Evidence:
        names = ", ".join(n for d in nics for n in d.rdma) or ", ".join(d.bdf for d in nics)
        captures = {"gpus": str(len(gpus)), "nics": names}
        return self._evidence(ctx, "peermem_missing", "nvidia_peermem", captures, {})

    def _acs_evidence(
        self, ctx: CollectContext, bridge: str, bits: list[str], peers: set[str]
    ) -> Evidence:
        between = ", ".join(sorted(peers))
        captures = {"bits": ",".join(bits), "between": between}
        return self._evidence(ctx, "acs_redirect", bridge, captures, {"named": " and ".join(bits)})

    def _iommu_evidence(self, ctx: CollectContext, peers: list[PciDevice]) -> Evidence:
        captures = {"devices": ", ".join(d.bdf for d in peers)}
        return self._evidence(ctx, "iommu_translated", "iommu", captures, {"count": len(peers)})
