"""Compare an NCCL topology with the golden profile of its SKU: each difference names the
device path ("cpu 0 / pci 0000:17:00.0 / gpu 0000:1b:00.0") and what changed. Pure: two
models in, a list out; judging how bad a difference is belongs to the caller (settings data).
"""

from __future__ import annotations

from dataclasses import dataclass

from denpex.fabric.nccl_topo.model import NVSWITCH_CLASS, NvLink, Pci, Placed, Topology

DIFFERENCE_KINDS = (
    "cpu_missing",
    "cpu_extra",
    "gpu_missing",
    "gpu_extra",
    "gpu_moved",
    "gpu_sm",
    "nic_missing",
    "nic_extra",
    "nic_moved",
    "pair_split",
    "nvlink_missing",
    "nvlink_fewer",
    "nvlink_extra",
    "nic_speed_lower",
    "nic_speed_higher",
    "gdr_off",
    "pci_link_lower",
    "c2c_lower",
    "pcilink_missing",
    "nic_rail_changed",
)
NVSWITCHES = "NVSwitch"  # the peer of NVSwitch links compared as one total


@dataclass(frozen=True, slots=True)
class Difference:
    kind: str  # one of DIFFERENCE_KINDS
    path: str  # where: the device path in the checked topology (the golden's when absent)
    device: str  # bus id, net port or "gpu X + net Y"
    expected: str
    actual: str
    message: str

    def describe(self) -> str:
        return f"{self.path}: {self.message}"


def _meeting_point(a: tuple[str, ...], b: tuple[str, ...]) -> str | None:
    """The deepest common ancestor of two chains ("pci 0000:17:00.0", "cpu 0"), or None when
    they only meet across CPUs (NCCL's SYS distance)."""
    common = None
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        common = x
    return common


def near_nets(gpu: Placed, nets: tuple[Placed, ...]) -> list[tuple[Placed, str]]:
    """The net ports sharing the GPU's nearest PCI switch (NCCL's PIX/PXB pairs): the NICs a
    GPU's GPUDirect RDMA traffic is meant to use."""
    best: list[tuple[Placed, str]] = []
    depth = 1  # below the CPU only: ports reached through the root complex are not pairs
    for net in nets:
        point = _meeting_point(gpu.chain, net.chain)
        if point is None:
            continue
        level = net.chain.index(point)
        if level > depth:
            best, depth = [(net, point)], level
        elif level == depth:
            best.append((net, point))
    return best


def _speed(text: str | None) -> float | None:
    try:
        return float((text or "").split()[0])
    except (ValueError, IndexError):
        return None


def compare_topologies(
    golden: Topology, actual: Topology, *, allow_subset: bool = False
) -> list[Difference]:
    """Every difference of `actual` from `golden`, in golden order. `allow_subset`: the
    actual may hold only some of the golden's CPUs and GPUs (a job on part of a node, as NCCL
    dumps only the GPUs of its communicator); NIC ports missing are still differences."""
    out: list[Difference] = []
    full = golden.source == "nccl" and actual.source == "nccl"  # NVLink, GDR, SM known
    have = {cpu.numaid for cpu in actual.cpus}
    want = {cpu.numaid for cpu in golden.cpus}
    if not allow_subset:
        for numaid in sorted(want - have):
            out.append(_diff("cpu_missing", f"cpu {numaid}", numaid, "present", "absent"))
    for numaid in sorted(have - want):
        out.append(_diff("cpu_extra", f"cpu {numaid}", numaid, "absent", "present"))
    out += _placement(golden.gpus, actual.gpus, "gpu", allow_subset)
    out += _placement(golden.nets, actual.nets, "nic", False)
    actual_gpus = {p.key: p for p in actual.gpus}
    actual_nets = {p.key: p for p in actual.nets}
    for gpu in golden.gpus:
        now = actual_gpus.get(gpu.key)
        if now is None:
            continue
        for net, point in near_nets(gpu, golden.nets):
            net_now = actual_nets.get(net.key)
            if net_now is None:
                continue
            point_now = _meeting_point(now.chain, net_now.chain) or "across CPUs"
            if point_now != point:
                out.append(
                    _diff(
                        "pair_split",
                        now.path,
                        f"gpu {gpu.key} + net {net.node[4:]}",
                        point,
                        point_now,
                        f"GPU {gpu.key} and net {net.node[4:]} met at {point} in the golden, "
                        f"now at {point_now}: GPUDirect RDMA between them crosses more of the "
                        "PCI tree or is off",
                    )
                )
        out += _gpu_details(gpu, now, full)
    for net in golden.nets:
        now = actual_nets.get(net.key)
        if now is not None:
            out += _net_details(net, now, full)
    out += _pcilinks(golden, actual)
    return out


def _pcilinks(golden: Topology, actual: Topology) -> list[Difference]:
    """Direct links between PCI switches (`<pcilink>`, e.g. Broadcom switches paired for
    P2P) the golden has and the dump lacks, where the dump holds both switches."""
    present = {pci.busid for cpu in actual.cpus for pci in _all_pci(cpu.children)}
    have = set(actual.pcilinks())
    out = []
    for switch, target in golden.pcilinks():
        if (switch, target) in have or not {switch, target} <= present:
            continue
        out.append(
            _diff(
                "pcilink_missing",
                f"pci {switch}",
                switch,
                f"linked to {target}",
                "no link",
                f"PCI switch {switch} has no direct link to {target}; the golden has one: "
                "P2P traffic between them goes up through the CPU",
            )
        )
    return out


def _all_pci(children: tuple[Pci, ...]) -> list[Pci]:
    found: list[Pci] = []
    for pci in children:
        found.append(pci)
        found += _all_pci(pci.children)
    return found


def _nvlink_peers(
    want: tuple[NvLink, ...], have: tuple[NvLink, ...]
) -> tuple[dict[str, NvLink], dict[str, NvLink]]:
    """The links of both sides by peer. Where either side cannot see its NVSwitches (NCCL
    merges those links into one, target fffffff:ffff:ff), NVSwitch links are compared as one
    total on each side: a VM's dump then matches a bare-metal golden of the same SKU."""
    merge = any(link.hidden for link in (*want, *have))

    def by_peer(links: tuple[NvLink, ...]) -> dict[str, NvLink]:
        found: dict[str, NvLink] = {}
        for link in links:
            if merge and link.to_nvswitch:
                before = found.get(NVSWITCHES)
                count = link.count + (before.count if before else 0)
                found[NVSWITCHES] = NvLink(NVSWITCHES, count, NVSWITCH_CLASS)
            else:
                found[link.target] = link
        return found

    return by_peer(want), by_peer(have)


def _placement(
    golden: tuple[Placed, ...], actual: tuple[Placed, ...], kind: str, allow_subset: bool
) -> list[Difference]:
    out: list[Difference] = []
    have = {p.key: p for p in actual}
    want = {p.key: p for p in golden}
    noun = "GPU" if kind == "gpu" else "net"
    for key, placed in want.items():
        now = have.get(key)
        if now is None:
            if not allow_subset:
                out.append(
                    _diff(
                        f"{kind}_missing",
                        placed.path,
                        key,
                        "present",
                        "absent",
                        f"{noun} {placed.node.split(' ', 1)[1]} of the golden is absent",
                    )
                )
        elif now.chain != placed.chain:
            expected, got = " / ".join(placed.chain), " / ".join(now.chain)
            out.append(
                _diff(
                    f"{kind}_moved",
                    now.path,
                    key,
                    expected,
                    got,
                    f"{noun} {now.node.split(' ', 1)[1]} sits behind {got}; "
                    f"the golden has it behind {expected}",
                )
            )
    for key, placed in have.items():
        if key not in want:
            out.append(
                _diff(
                    f"{kind}_extra",
                    placed.path,
                    key,
                    "absent",
                    "present",
                    f"{noun} {placed.node.split(' ', 1)[1]} is not in the golden",
                )
            )
    return out


def _gpu_details(golden: Placed, actual: Placed, full: bool) -> list[Difference]:
    out = _pci_link(golden, actual)
    want, have = golden.gpu, actual.gpu
    if not full or want is None or have is None:
        return out
    key = golden.key
    if want.sm is not None and have.sm is not None and want.sm != have.sm:
        out.append(
            _diff(
                "gpu_sm",
                actual.path,
                key,
                str(want.sm),
                str(have.sm),
                f"GPU {key} is SM {have.sm}; the golden's is SM {want.sm}",
            )
        )
    if want.gdr and have.gdr is False:
        out.append(
            _diff(
                "gdr_off",
                actual.path,
                key,
                "1",
                "0",
                f"GPU {key} reports GPUDirect RDMA off (gdr=0); on in the golden",
            )
        )
    out += _c2c(golden, actual)
    wanted, links = _nvlink_peers(want.nvlinks, have.nvlinks)
    for link in wanted.values():
        now = links.pop(link.target, None)
        bw = link.bandwidth_gb_s(want.sm)
        rate = f" ({bw} GB/s)" if bw else ""
        if now is None:
            out.append(
                _diff(
                    "nvlink_missing",
                    actual.path,
                    key,
                    f"{link.count} to {link.target}",
                    "none",
                    f"GPU {key} has no NVLink to {link.target}; the golden has {link.count}{rate}",
                )
            )
        elif now.count < link.count:
            out.append(
                _diff(
                    "nvlink_fewer",
                    actual.path,
                    key,
                    f"{link.count} to {link.target}",
                    f"{now.count} to {link.target}",
                    f"GPU {key} has {now.count} "
                    f"NVLink(s) to {link.target}; the golden has {link.count}{rate}",
                )
            )
    for target, now in sorted(links.items()):
        out.append(
            _diff(
                "nvlink_extra",
                actual.path,
                key,
                "none",
                f"{now.count} to {target}",
                f"GPU {key} has {now.count} NVLink(s) to {target}, not in the golden",
            )
        )
    return out


def _c2c(golden: Placed, actual: Placed) -> list[Difference]:
    want = golden.gpu.c2c if golden.gpu else None
    have = actual.gpu.c2c if actual.gpu else None
    if want is None:
        return []
    if have is not None and have.count >= want.count and have.bw_mb_s >= want.bw_mb_s:
        return []
    expected = f"{want.count} x {want.bw_mb_s} MB/s ({want.bandwidth_gb_s} GB/s)"
    got = "none" if have is None else f"{have.count} x {have.bw_mb_s} MB/s"
    now = "no C2C link" if have is None else f"C2C at {have.bandwidth_gb_s} GB/s"
    return [
        _diff(
            "c2c_lower",
            actual.path,
            golden.key,
            expected,
            got,
            f"GPU {golden.key} has {now} to its CPU; the golden has {expected}",
        )
    ]


def _net_details(golden: Placed, actual: Placed, full: bool) -> list[Difference]:
    out = _pci_link(golden, actual) if golden.pci and actual.pci else []
    want, have = golden.net, actual.net
    if want is None or have is None:
        return out
    label = have.label
    if want.speed_mbps and have.speed_mbps and have.speed_mbps != want.speed_mbps:
        kind = "nic_speed_lower" if have.speed_mbps < want.speed_mbps else "nic_speed_higher"
        out.append(
            _diff(
                kind,
                actual.path,
                label,
                str(want.speed_mbps),
                str(have.speed_mbps),
                f"net {label} runs at {have.speed_mbps} Mb/s; the golden at {want.speed_mbps} Mb/s",
            )
        )
    for what in ("rail", "plane"):
        before, now = getattr(want, what), getattr(have, what)
        if before is not None and now is not None and before != now:
            out.append(
                _diff(
                    "nic_rail_changed",
                    actual.path,
                    label,
                    f"{what} {before}",
                    f"{what} {now}",
                    f"net {label} is on {what} {now}; the golden has it on {what} {before}",
                )
            )
    if full and want.gdr and have.gdr is False:
        out.append(
            _diff(
                "gdr_off",
                actual.path,
                label,
                "1",
                "0",
                f"net {label} reports GPUDirect RDMA off (gdr=0); on in the golden",
            )
        )
    return out


def _pci_link(golden: Placed, actual: Placed) -> list[Difference]:
    if golden.pci is None or actual.pci is None:
        return []
    want_speed, have_speed = (_speed(p.attr("link_speed")) for p in (golden.pci, actual.pci))
    want_width, have_width = (_speed(p.attr("link_width")) for p in (golden.pci, actual.pci))
    lower = (want_speed and have_speed and have_speed < want_speed) or (
        want_width and have_width and have_width < want_width
    )
    if not lower:
        return []
    expected = f"{golden.pci.attr('link_speed')} x{golden.pci.attr('link_width')}"
    got = f"{actual.pci.attr('link_speed')} x{actual.pci.attr('link_width')}"
    return [
        _diff(
            "pci_link_lower",
            actual.path,
            actual.pci.busid,
            expected,
            got,
            f"PCI link of {actual.pci.busid} is {got}; the golden's is {expected}",
        )
    ]


def _diff(
    kind: str, path: str, device: str, expected: str, actual: str, message: str = ""
) -> Difference:
    if not message:
        message = f"{kind.replace('_', ' ')}: {device} (golden {expected}, now {actual})"
    return Difference(kind, path, device, expected, actual, message)
