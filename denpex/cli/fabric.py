"""`denpex fabric snapshot|check`: write a node's PCI/NVLink/NIC topology as a golden profile
and compare a node (or an NCCL topology dump) with it. Thin: reading, modelling and comparing
live in denpex.fabric; this module parses arguments and prints.
"""

from __future__ import annotations

import argparse
import json
import sys

from denpex.cli.common import UsageError

EPILOG = """\
examples:
  # on a known-good node of the SKU, from what NCCL saw (a job ran with
  # NCCL_TOPO_DUMP_FILE=/tmp/topo.xml) or from sysfs when no dump exists yet:
  denpex fabric snapshot --nccl-topo /tmp/topo.xml > golden-dgx-h100.xml
  denpex fabric snapshot > golden-dgx-h100-sysfs.xml
  # on any node of that SKU:
  denpex fabric check --golden golden-dgx-h100.xml --nccl-topo /tmp/topo.xml
  denpex fabric check --golden golden-dgx-h100-sysfs.xml --json

exit status: `check` exits 0 when the topology matches the golden profile, 1 when it differs
(each difference is printed with its device path), 2 on bad input.
"""


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "fabric",
        help="snapshot a node's GPU/NIC topology as a golden profile, check nodes against it",
        description="Golden topology profiles per SKU: `snapshot` writes the normalised "
        "topology (CPUs, PCI switches, GPUs with NVLinks, NICs with speeds) from an NCCL "
        "topology dump or from sysfs; `check` compares a node with it and names each "
        "difference by device path (a GPU–NIC pair behind a different switch, a missing "
        "NVLink, a NIC at a lower speed).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="fabric_command", metavar="ACTION", required=True)
    snapshot = actions.add_parser(
        "snapshot",
        help="print the normalised topology (a golden profile) on stdout",
        description="Print the node's topology in NCCL's XML format, normalised (sorted, "
        "job- and node-specific attributes such as rank and GUID dropped) so that two healthy "
        "nodes of one SKU give identical files.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _source_options(snapshot)
    snapshot.add_argument("-o", "--output", metavar="FILE", help="write to FILE, not stdout")
    snapshot.set_defaults(handler=handle_snapshot)
    check = actions.add_parser(
        "check",
        help="compare this node (or an NCCL dump) with a golden profile",
        description="Compare the topology with a golden profile and print each difference "
        "with its device path. Exit 0: identical; 1: differences; 2: bad input.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("--golden", metavar="FILE", required=True, help="the golden profile")
    _source_options(check)
    check.add_argument(
        "--subset",
        action="store_true",
        help="the topology may hold only some of the golden's GPUs (a job on part of a node)",
    )
    check.add_argument("--json", action="store_true", help="print the differences as JSON")
    check.set_defaults(handler=handle_check)


def _source_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nccl-topo",
        metavar="FILE",
        help="an NCCL topology dump (what NCCL_TOPO_DUMP_FILE wrote); default: read sysfs",
    )
    parser.add_argument("--sysfs", default="/sys", metavar="DIR", help="sysfs root (default /sys)")
    parser.add_argument(
        "--procfs", default="/proc", metavar="DIR", help="procfs root (default /proc)"
    )


def _topology(args: argparse.Namespace):
    from denpex.core.roots import Roots
    from denpex.fabric.nccl_topo.collector import TopologyError, read_topology
    from denpex.fabric.nccl_topo.sysfs import sysfs_topology

    if args.nccl_topo:
        try:
            return read_topology(args.nccl_topo)
        except TopologyError as exc:
            raise UsageError(str(exc)) from None
    topology = sysfs_topology(Roots(procfs=args.procfs, sysfs=args.sysfs))
    if not topology.gpus and not topology.nets:
        raise UsageError(
            f"found no NVIDIA GPU or RDMA NIC under {args.sysfs}/bus/pci/devices; "
            "give --nccl-topo FILE or --sysfs DIR"
        )
    return topology


def handle_snapshot(args: argparse.Namespace) -> int:
    from denpex.fabric.nccl_topo.model import snapshot_xml

    text = snapshot_xml(_topology(args))
    if args.output:
        try:
            with open(args.output, "w") as handle:
                handle.write(text)
        except OSError as exc:
            raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    else:
        sys.stdout.write(text)
    return 0


def handle_check(args: argparse.Namespace) -> int:
    from denpex.fabric.nccl_topo.collector import TopologyError, read_topology
    from denpex.fabric.nccl_topo.diff import compare_topologies

    try:
        golden = read_topology(args.golden)
    except TopologyError as exc:
        raise UsageError(f"golden profile: {exc}") from None
    differences = compare_topologies(golden, _topology(args), allow_subset=args.subset)
    if args.json:
        rows = [
            {
                "kind": d.kind,
                "path": d.path,
                "device": d.device,
                "expected": d.expected,
                "actual": d.actual,
                "message": d.message,
            }
            for d in differences
        ]
        print(json.dumps({"golden": args.golden, "differences": rows}, indent=2))
    else:
        for difference in differences:
            print(difference.describe())
        if not differences:
            print(f"topology matches {args.golden}", file=sys.stderr)
    return 1 if differences else 0
