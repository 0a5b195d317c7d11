"""`denpex agent spool show [--dead-letter] [--json]` and `denpex agent spool requeue`: what
the agent's disk spool still holds, what the endpoint refused for good, and putting the
refused records back once the endpoint or its credentials are fixed. Thin: the reading is
denpex.agent.dead_letter's; listing never changes a file and works beside a running agent.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from denpex.cli.common import UsageError

SHOWN = 50  # records listed without --limit


def add_parser(agent_commands: Any, load_config: Any) -> None:
    spool = agent_commands.add_parser(
        "spool",
        help="what the disk spool and its dead-letter segment hold",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    actions = spool.add_subparsers(dest="spool_command", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="list spooled (or dead-letter) records")
    show.add_argument(
        "--dead-letter", action="store_true", help="the records the endpoint refused for good"
    )
    show.add_argument("--json", action="store_true", help="JSON on stdout")
    show.add_argument("--limit", type=int, default=None, help=f"records listed (default {SHOWN})")
    requeue = actions.add_parser(
        "requeue", help="move the dead-letter records back into the spool (after a fix)"
    )
    for action in (show, requeue):
        # also after the action; SUPPRESS keeps a value given before it (`agent --config F`)
        action.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS)
        action.add_argument("--state-dir", metavar="DIR", default=argparse.SUPPRESS)
    show.set_defaults(handler=lambda args: show_spool(args, load_config(args)))
    requeue.set_defaults(handler=lambda args: requeue_dead_letter(load_config(args)))


def show_spool(args: argparse.Namespace, config: Any) -> int:
    from denpex.agent.dead_letter import dead_letter_dir, list_pending
    from denpex.core import jsonio

    directory = config.state_dir / "spool"
    if args.dead_letter:
        directory = dead_letter_dir(directory)
    limit = args.limit if args.limit is not None else (None if args.json else SHOWN)
    listing = list_pending(directory, limit)
    if args.json:
        data = {
            "directory": str(listing.directory),
            "dead_letter": args.dead_letter,
            "pending": listing.pending,
            "segments": listing.segments,
            "bytes": listing.bytes,
            "records": listing.records,
        }
        sys.stdout.buffer.write(jsonio.dumps(data, pretty=True) + b"\n")
        return 0
    what = "dead-letter segment" if args.dead_letter else "spool"
    print(
        f"{what} {listing.directory}: {listing.pending} record(s) in {listing.segments} "
        f"segment(s), {listing.bytes} bytes"
    )
    for entry in listing.records:
        print("  " + (_dead_line(entry) if args.dead_letter else _record_line(entry)))
    if listing.pending > len(listing.records):
        print(f"  … {listing.pending - len(listing.records)} more (--limit, --json)")
    if args.dead_letter and listing.pending:
        print("fix the endpoint or its credentials, then: denpex agent spool requeue")
    return 0


def _record_line(record: dict[str, Any]) -> str:
    return f"{record.get('id', '?')}  {record.get('category', '?')}  {_short(record)}"


def _dead_line(entry: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(entry.get("at_ns") or 0) / 1e9))
    status = entry.get("status")
    refused = f"HTTP {status}" if status is not None else "invalid"
    record = entry.get("record")
    record = record if isinstance(record, dict) else {}
    reason = str(entry.get("reason") or "")[:80]
    return f"{when}  {refused}  {_record_line(record)}  ({reason})"


def _short(record: dict[str, Any]) -> str:
    body = str(record.get("body") or record.get("summary") or "")
    return body if len(body) <= 80 else body[:77] + "…"


def requeue_dead_letter(config: Any) -> int:
    from denpex.agent.dead_letter import requeue
    from denpex.agent.spool import SpoolLockedError

    directory = config.state_dir / "spool"
    try:
        moved = requeue(directory)
    except SpoolLockedError:
        moved = _ask_the_running_agent(config)
    print(f"requeued {moved} record(s) from {directory}/dead-letter into the spool")
    return 0


def _ask_the_running_agent(config: Any) -> int:
    """A running agent owns the spool: it moves them itself (root on its Unix socket)."""
    from denpex.lite.agent_link import AgentLink

    link = AgentLink(config.socket)
    moved = link.requeue_dead_letter()
    if moved is None:
        raise UsageError(
            f"the running agent holds the spool and did not requeue: {link.reason} "
            "(run this as root, or stop the agent, requeue, and start it again)"
        )
    return moved
