"""`denpex scan [FILES...]`: diagnose logs that already exist, or a stream on stdin."""

from __future__ import annotations

import argparse
import glob
import os
import signal
import sys

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
    parser.add_argument(
        "--jobs",
        "-j",
        type=int,
        metavar="N",
        help="files scanned at once, one process each (default: the cores available); "
        "the diagnosis is the same for every N",
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
    if args.tee:  # the stream is copied by the relay, never slowed by the scan
        return session.tee(
            0, 1, host=args.host, rank=args.rank, exit_code=exit_code, exit_signal=exit_signal
        )
    if args.jobs is not None and args.jobs < 1:
        raise UsageError("--jobs takes a number of processes, at least 1")
    if "-" not in files and not args.follow:
        return _scan_files(args, session, files, exit_code, exit_signal)
    for path in files:
        if path == "-":
            session.scan_fd("stdin", sys.stdin.fileno(), host=args.host, rank=args.rank)
            continue
        host, rank = hints_from_path(path)
        host = args.host or host
        rank = args.rank if args.rank is not None else rank
        try:
            if args.follow:
                session.follow(path, host=host, rank=rank)
            else:
                session.scan_file(path, host=host, rank=rank)
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    diagnosis = session.conclude(exit_code, exit_signal)
    return 1 if diagnosis.status == "failed" else 0


def _scan_files(args, session, files: list[str], exit_code, exit_signal) -> int:
    """Named files only: each read in a process of its own (--jobs), merged in their order."""
    from denpex.lite.file_scan import FileInput, UnreadableFile, available_cores, scan_files
    from denpex.lite.prefixes import hints_from_path

    inputs = []
    for path in files:
        host, rank = hints_from_path(path)
        rank = args.rank if args.rank is not None else rank
        inputs.append(FileInput(path, args.host or host, rank))
    try:
        scan_files(session, inputs, args.jobs or available_cores())
    except UnreadableFile as exc:
        raise UsageError(str(exc)) from None
    diagnosis = session.conclude(exit_code, exit_signal)
    return 1 if diagnosis.status == "failed" else 0
