"""`denpex scan [FILES...]`: diagnose logs that already exist, or a stream on stdin."""

from __future__ import annotations

import argparse
import glob
import os
import signal
import sys
import time

from denpex.cli.common import UsageError, add_report_options, catalog_for, report_options

DESCRIPTION = """\
Read log files (or stdin) from one or many ranks and hosts, match every line against
denpex's failure signatures, and print the root cause, its evidence and what to do.

Each file's host and rank come from its lines (torchrun `[rank3]:`, `srun -l`, syslog,
NCCL prefixes) or its path (node7/rank3.log); --host/--rank override them.
"""
EPILOG = """\
examples:
  python train.py 2>&1 | denpex scan --tee        # watch a job live, diagnosis at the end
  denpex scan --json node*/rank*.log kern.log      # several ranks, hosts and the kernel log
  denpex scan --follow train.log                   # tail a growing log; Ctrl-C to conclude
  denpex scan --exit-code 137 job.out              # tell denpex how the job ended

exit status: 0 no failure found, 1 failure diagnosed, 2 bad arguments or unreadable input.
"""
CHUNK = 1 << 20


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "scan",
        help="diagnose existing logs or a piped stream",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="log files (globs are expanded); '-' or nothing reads stdin",
    )
    parser.add_argument(
        "--tee", action="store_true", help="copy stdin to stdout byte for byte while scanning it"
    )
    parser.add_argument("--json", action="store_true", help="print the diagnosis JSON on stdout")
    parser.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep reading a growing file until interrupted (Ctrl-C)",
    )
    parser.add_argument("--host", help="host name for lines that do not carry one")
    parser.add_argument("--rank", type=int, help="rank for lines that do not carry one")
    parser.add_argument(
        "--exit-code",
        type=int,
        metavar="N",
        help="the job's exit status, if known (137 = SIGKILL, 0 = success)",
    )
    add_report_options(parser)
    parser.set_defaults(handler=handle)


def _expand(patterns: list[str]) -> list[str]:
    files: list[str] = []
    for pattern in patterns:
        if pattern == "-":
            files.append(pattern)
            continue
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise UsageError(f"no file matches {pattern}")
        files.extend(matches)
    for path in files:
        if path != "-" and not os.path.isfile(path):
            what = "is a directory" if os.path.isdir(path) else "does not exist"
            raise UsageError(f"cannot read {path}: it {what}")
        if path != "-" and not os.access(path, os.R_OK):
            raise UsageError(f"cannot read {path}: permission denied")
    return files


def _exit_from(args: argparse.Namespace) -> tuple[int | None, int | None]:
    code = args.exit_code
    if code is not None and code > 128 and code - 128 < signal.NSIG:
        return None, code - 128
    return code, None


def handle(args: argparse.Namespace) -> int:
    from denpex.lite.prefixes import hints_from_path
    from denpex.lite.session import LiteSession

    if args.tee and args.json:
        raise UsageError("--tee writes the stream to stdout, so --json cannot; use --report FILE")
    if args.tee and args.files not in ([], ["-"]):
        raise UsageError("--tee copies stdin; do not name files with it")
    if args.follow and (len(args.files) != 1 or args.files == ["-"]):
        raise UsageError("--follow takes exactly one file")
    files = _expand(args.files) if args.files else ["-"]
    if files.count("-") > 1:
        raise UsageError("stdin ('-') can be read only once")
    if files == ["-"] and sys.stdin.isatty() and not args.tee:
        raise UsageError("nothing to scan: name log files, or pipe a job's output into denpex scan")

    catalog = catalog_for(args)
    options = report_options(args, json_stdout=args.json)
    session = LiteSession(catalog, options, host=args.host)
    exit_code, exit_signal = _exit_from(args)

    if files == ["-"]:
        return _scan_stdin(args, session, exit_code, exit_signal)
    for path in files:
        if path == "-":
            session.scanner.stream("stdin", host=args.host, rank=args.rank)
            _read_fd(session, "stdin", sys.stdin.fileno())
            continue
        host, rank = hints_from_path(path)
        session.scanner.stream(
            path,
            host=args.host or host,
            rank=args.rank if args.rank is not None else rank,
        )
        try:
            with open(path, "rb") as handle_:
                if args.follow:
                    _follow(session, path, handle_)
                else:
                    while chunk := handle_.read(CHUNK):
                        session.scanner.feed(path, chunk)
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    diagnosis = session.conclude(exit_code, exit_signal)
    return 1 if diagnosis.status == "failed" else 0


def _read_fd(session, name: str, fd: int) -> None:
    while chunk := os.read(fd, CHUNK):
        session.scanner.feed(name, chunk)


def _follow(session, path: str, handle_) -> None:
    """Read to the end, then keep polling for growth until SIGINT/SIGTERM."""
    stop = {"now": False}

    def request_stop(signum, frame) -> None:
        stop["now"] = True

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    reported = 0
    try:
        while not stop["now"]:
            chunk = handle_.read(CHUNK)
            if chunk:
                session.scanner.feed(path, chunk)
                reported = _print_new_failures(session, reported)
                continue
            try:
                if os.stat(path).st_size < handle_.tell():  # truncated or rotated in place
                    handle_.seek(0)
            except FileNotFoundError:
                pass
            time.sleep(0.25)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _print_new_failures(session, already: int) -> int:
    evidence = session.scanner.evidence
    for item in evidence[already:]:
        if item.is_failure and session.options.text:
            where = " ".join(
                p
                for p in (
                    item.event.host or "",
                    f"r{item.event.rank}" if item.event.rank is not None else "",
                )
                if p
            )
            print(f"denpex: [{item.id}] {item.category} {where}: {item.summary}", file=sys.stderr)
    return len(evidence)


def _scan_stdin(args, session, exit_code, exit_signal) -> int:
    """stdin is scanned in-process unless --tee, which must never slow the stream it copies."""
    if not args.tee:
        session.scanner.stream("stdin", host=args.host, rank=args.rank)
        _read_fd(session, "stdin", 0)
        diagnosis = session.conclude(exit_code, exit_signal)
        return 1 if diagnosis.status == "failed" else 0
    from denpex.lite.runner import tee_stream

    def factory(_pid):
        session.scanner.stream("stdout", host=args.host, rank=args.rank)
        return _TeeSession(session, exit_code, exit_signal)

    result = tee_stream(0, 1, session_factory=factory)
    if result.analysis_status not in (0, 1):
        return 2  # the analysis itself failed; it said why on stderr
    return result.analysis_status


class _TeeSession:
    """Adapts LiteSession to the runner for `--tee`: the stream's end is not a job's exit."""

    def __init__(self, session, exit_code, exit_signal) -> None:
        self.session = session
        self.exit_code = exit_code
        self.exit_signal = exit_signal

    def feed(self, stream: int, data: bytes, gap: bool) -> None:
        self.session.feed(stream, data, gap)

    def tick(self) -> None:
        pass

    def finish(self, result) -> int:
        """Returns the exit status `denpex scan` must end with (0 ok, 1 failure found)."""
        stats = {"dropped_analysis_bytes": int(result.bytes_dropped)}
        diagnosis = self.session.conclude(self.exit_code, self.exit_signal, stats)
        return 1 if diagnosis.status == "failed" else 0
