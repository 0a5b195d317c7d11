"""`denpex explain ID|CATEGORY`: what a signature, a detector or a failure category means,
and what to do."""

from __future__ import annotations

import argparse

from denpex.cli.common import UsageError, catalog_for, describe_signature


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "explain",
        help="what a signature, detector or failure category means and what to do",
        description="Explain a signature id (gpu.fallen_off_bus.xid79), a detector id "
        "(train.sdc.canary_mismatch) or a taxonomy category (gpu.fallen_off_bus): what it "
        "means, the usual cause, what to do.",
    )
    parser.add_argument("name", metavar="ID|CATEGORY")
    parser.add_argument(
        "--signatures",
        metavar="DIR",
        action="append",
        default=[],
        help="also load site-local signatures from DIR",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from denpex.catalog.reference import describe_detector
    from denpex.core import load_taxonomy
    from denpex.diagnosis.summary import ACTION_TEXT

    catalog = catalog_for(args)
    sig = catalog.by_id.get(args.name)
    if sig is not None:
        print(describe_signature(sig))
        return 0
    detector = catalog.detectors.get(args.name)
    if detector is not None:
        print(describe_detector(detector))
        return 0
    taxonomy = load_taxonomy()
    if args.name not in taxonomy:
        known = [*catalog.by_id, *catalog.detectors]
        close = sorted(i for i in known if args.name in i)[:5]
        hint = f"; did you mean {', '.join(close)}?" if close else "; see `denpex signatures list`"
        raise UsageError(
            f"{args.name!r} is neither a signature id, a detector id nor a category{hint}"
        )
    category = taxonomy[args.name]
    members = [s for s in catalog.signatures if s.category == category.id]
    detectors = [d for d in catalog.detectors.values() if d.category == category.id]
    actions = sorted(({s.action for s in members} | {d.action for d in detectors}) - {"none"})
    print(f"{category.id}: {category.title}")
    print(f"  layer {category.layer}; {len(members)} signature(s), {len(detectors)} detector(s)")
    for action in actions:
        print(f"  what to do: {action}: {ACTION_TEXT.get(action, action)}")
    for s in members:
        print(f"  {s.id:<56} {s.severity:<8} {s.summary}")
    for d in detectors:
        print(f"  {d.id:<56} {d.severity:<8} {d.summary}  [detector]")
    return 0
