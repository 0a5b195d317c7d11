"""`denpex run -- CMD ...`: run a job transparently and diagnose it when it ends."""

from __future__ import annotations

import argparse
import socket
import sys

from denpex.cli.common import (
    UsageError,
    add_report_options,
    catalog_for,
    check_signature_dirs,
    report_options,
)
from denpex.lite.job_supervisor import LINGER_S

DESCRIPTION = """\
Run CMD exactly as if denpex were not there (same output, input, signals and exit status),
while matching every line it prints against denpex's failure signatures. When CMD ends,
print the root cause, the lines that prove it and what to do, on stderr.

CMD runs in a pseudo-terminal when denpex's stdout is a terminal (progress bars and colours
keep working), else with pipes (stdout and stderr kept apart); --pty/--no-pty force one.
Whatever CMD leaves running ends with the run (and with denpex, if denpex is killed).
"""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds: {text!r}")
    return value


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "run",
        help="run a training job and diagnose it when it ends",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="denpex run [options] -- CMD [ARGS...]",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--pty",
        dest="pty",
        action="store_true",
        default=None,
        help="run CMD in a pseudo-terminal even when stdout is not a terminal",
    )
    mode.add_argument(
        "--no-pty",
        dest="pty",
        action="store_false",
        help="run CMD with pipes even when stdout is a terminal",
    )
    parser.add_argument(
        "--no-analysis", action="store_true", help="only wrap CMD: no matching, no report"
    )
    parser.add_argument(
        "--linger",
        type=_seconds,
        default=LINGER_S,
        metavar="SECONDS",
        help="after CMD exits, keep relaying the output its descendants still hold open as "
        "long as it is never silent this long (default %(default)g; 'inf': until the last one "
        "closes it); then what is left of the job is ended (SIGTERM, then SIGKILL)",
    )
    add_report_options(parser)
    parser.add_argument(
        "cmd", nargs=argparse.REMAINDER, metavar="CMD", help="the command to run, after --"
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from denpex.lite.hostwatch import RunHostWatch
    from denpex.lite.runner import run_command
    from denpex.lite.sdk_channel import SdkListener
    from denpex.lite.session import LiteSession

    argv = list(args.cmd)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("no command given; usage: denpex run [options] -- CMD [ARGS...]")
    factory = None
    sdk: SdkListener | None = None
    if not args.no_analysis:
        check_signature_dirs(args)
        options = report_options(args)
        options.title = f"denpex: {' '.join(argv)[:120]}"
        options.command = tuple(argv)
        # before the job starts, so nothing it triggers is missed
        host_watch = RunHostWatch(host=socket.gethostname())
        try:
            # bound before the analyzer forks, so both share it; without it the SDK writes
            # `denpex-sdk:` lines to stderr, which the analysis reads all the same
            sdk = SdkListener.open()
        except OSError as exc:
            print(
                f"denpex run: no SDK socket ({exc}); SDK evidence goes to stderr", file=sys.stderr
            )

        def factory(child_pid: int | None) -> LiteSession:
            # the catalog loads in the analyzer process, so the job starts at once; a broken
            # site-local catalog then costs the analysis (said on stderr), never the job
            try:
                catalog = catalog_for(args)
            except UsageError as exc:
                print(f"denpex run: {exc}", file=sys.stderr)
                raise RuntimeError("no diagnosis for this run: fix the signatures above") from None
            return LiteSession.for_run(catalog, options, child_pid, host_watch, sdk)

    try:
        return run_command(
            argv,
            use_pty=args.pty,
            session_factory=factory,
            linger=args.linger,
            extra_env=sdk.environ() if sdk is not None else None,
        )
    finally:
        if sdk is not None:
            sdk.close()
