"""`denpex agent`: the node agent as a daemon, or one collection with `--once`."""

from __future__ import annotations

import argparse
import sys

from denpex.cli.common import UsageError

MAX_METRICS_SHOWN = 60  # more than a screen of values is summarised; --json has them all
DISABLED = "disabled in the configuration"

DESCRIPTION = """\
Watch this node: the kernel log, the journal, pressure (PSI), cgroups, the processes of
registered jobs, NUMA, disks, PCIe links, eBPF where the kernel allows it, GPUs (NVML,
DCGM), InfiniBand/RoCE ports with PFC and congestion, NCCL topology against a golden
profile, GPUDirect prerequisites, and fabric managers (UFM, gNMI). Every line is
matched against the same signatures as `denpex scan`; evidence is attributed to the job,
rank and pid it concerns.

Serves on --listen (loopback by default): /metrics (Prometheus), /healthz (503 while a
collector is stuck or failing, or the spool cannot write), /v1/evidence?since=NS (recent
evidence as JSON); off loopback, reads need the bearer token of api.token_file. `denpex
run` registers its job on the Unix socket api.socket (<state_dir>/agent.sock), where each
user may register only their own processes. With an OTLP endpoint configured, evidence is
spooled to disk and delivered at least once; metrics are sent best effort.

SIGHUP reloads --config; SIGTERM or Ctrl-C stops.
"""

EPILOG = """\
examples:
  denpex agent --once                      # what this node shows right now
  denpex agent --once --json | jq .evidence
  denpex agent --config /etc/denpex/agent.yaml
  denpex agent --otlp-endpoint http://collector:4318
  denpex agent spool show --dead-letter    # what the endpoint refused for good
  denpex agent spool requeue               # ... back into the spool, after fixing it
  # a GPU scenario without a GPU (a fake NVML answers from the scenario file):
  DENPEX_NVML_SHIM=1 DENPEX_NVML_SCENARIO=examples/scenarios/xid79_at_start.yaml \
      denpex agent --once --collectors nvml
"""


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "agent",
        help="run the node agent (or one collection with --once)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", metavar="FILE", help="YAML settings (see defaults.yaml)")
    parser.add_argument("--once", action="store_true", help="collect once, print, and exit")
    parser.add_argument("--json", action="store_true", help="with --once: JSON on stdout")
    parser.add_argument("--listen", metavar="HOST:PORT", help="local API address")
    parser.add_argument("--host", metavar="NAME", help="node name in evidence (default: hostname)")
    parser.add_argument(
        "--state-dir", metavar="DIR", help="kernel-log position, journal cursor, spool"
    )
    parser.add_argument(
        "--otlp-endpoint", metavar="URL", help="OTLP/HTTP base URL, e.g. http://c:4318"
    )
    parser.add_argument("--procfs", metavar="DIR", help="read /proc from DIR (tests, containers)")
    parser.add_argument("--sysfs", metavar="DIR", help="read /sys from DIR")
    parser.add_argument("--devfs", metavar="DIR", help="read /dev from DIR")
    parser.add_argument(
        "--collectors",
        metavar="A,B",
        help="run only these collectors (names as in `denpex doctor`)",
    )
    parser.add_argument(
        "--control-plane",
        choices=("embedded",),
        help="embedded: also run the control plane (API, UI, ingest; SQLite under the state "
        "dir) in this process, for a small cluster's head node; this agent ships to it",
    )
    parser.add_argument(
        "--control-plane-listen",
        metavar="HOST:PORT",
        default="127.0.0.1:9479",
        help="with --control-plane embedded: where it serves (other nodes' agents ship here)",
    )
    parser.add_argument(
        "--control-plane-db",
        metavar="URL",
        help="with --control-plane embedded: its database (default: SQLite under the state dir)",
    )
    parser.add_argument(
        "--control-plane-tenant",
        metavar="NAME",
        default="default",
        help="with --control-plane embedded: the tenant this agent's evidence belongs to",
    )
    parser.set_defaults(handler=handle, embedded=None)
    from denpex.cli import agent_diag, agent_spool

    subcommands = parser.add_subparsers(dest="agent_command", metavar="COMMAND")
    agent_spool.add_parser(subcommands, load)
    agent_diag.add_parser(subcommands, load)


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    return {
        "listen": args.listen,
        "host": args.host,
        "state_dir": args.state_dir,
        "otlp.endpoint": args.otlp_endpoint,
        "roots.procfs": args.procfs,
        "roots.sysfs": args.sysfs,
        "roots.devfs": args.devfs,
        # the embedded control plane, once started, is where this agent's evidence goes
        "server.url": args.embedded.base_url if args.embedded else None,
        "server.token_file": str(args.embedded.settings.token_file) if args.embedded else None,
    }


def load(args: argparse.Namespace):
    from denpex.agent.config import CollectorConfig, ConfigError, load_config
    from denpex.agent.registry import COLLECTORS

    names = tuple(c.name for c in COLLECTORS)
    try:
        config = load_config(args.config, _overrides(args), known_collectors=names)
    except ConfigError as exc:
        raise UsageError("agent configuration " + str(exc)) from None
    if args.collectors:
        wanted = [n.strip() for n in args.collectors.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            raise UsageError(
                f"--collectors: unknown {', '.join(unknown)}; known: {', '.join(names)}"
            )
        for name in names:
            config.collectors.setdefault(name, CollectorConfig()).enabled = name in wanted
    return config


def handle(args: argparse.Namespace) -> int:
    from denpex.agent.daemon import Agent

    if args.json and not args.once:
        raise UsageError("--json goes with --once (the daemon serves JSON on /v1/evidence)")
    if args.once and args.control_plane:
        raise UsageError("--control-plane goes with the daemon, not with --once")
    config = load(args)
    if args.once:
        return _once(Agent(config, persist=False), args.json)
    if args.control_plane == "embedded":
        args.embedded = _start_control_plane(args, config.state_dir)
        config = load(args)
    agent = Agent(config)
    try:
        agent.start()
    except OSError as exc:
        _stop_control_plane(args)
        raise UsageError(
            f"cannot serve the API on {config.listen} and {config.socket}: {exc.strerror or exc}"
        ) from None
    except ValueError as exc:
        _stop_control_plane(args)
        raise UsageError(f"agent configuration: {exc}") from None
    assert agent.api is not None
    print(
        f"denpex agent: {config.host}: listening on {agent.api.url} and {config.socket} "
        f"({len(agent.states)} collectors; unavailable: "
        + (", ".join(f"{k} ({v})" for k, v in agent.unavailable.items()) or "none")
        + ")",
        file=sys.stderr,
        flush=True,
    )
    if args.embedded:
        print(
            f"denpex agent: embedded control plane on {args.embedded.base_url} "
            f"({args.embedded.settings.db_url.split('@')[-1]})",
            file=sys.stderr,
            flush=True,
        )
    try:
        agent.serve(
            lambda: load(args),
            lambda text: print(f"denpex agent: {text}", file=sys.stderr, flush=True),
        )
    finally:
        _stop_control_plane(args)
    return 0


def _start_control_plane(args: argparse.Namespace, state_dir):
    """The control plane in this process (`--control-plane embedded`), started and serving."""
    from denpex.agent.config import parse_listen

    try:
        from denpex.control.db import StoreError
        from denpex.control.embedded import EmbeddedControlPlane, EmbeddedSettings
    except ImportError as exc:
        raise UsageError(
            f"--control-plane embedded needs the server's dependencies ({exc.name}): "
            "pip install 'denpex[server]'"
        ) from None
    try:
        host, port = parse_listen(args.control_plane_listen)
    except ValueError as exc:
        raise UsageError(str(exc).replace("--listen", "--control-plane-listen")) from None
    plane = EmbeddedControlPlane(
        EmbeddedSettings(
            state_dir=state_dir / "control-plane",
            host=host,
            port=port,
            tenant=args.control_plane_tenant,
            url=args.control_plane_db,
        )
    )
    try:
        plane.start()
    except StoreError as exc:
        raise UsageError(f"--control-plane embedded: {exc}") from None
    except OSError as exc:
        raise UsageError(f"--control-plane embedded: {exc.strerror or exc}") from None
    return plane


def _stop_control_plane(args: argparse.Namespace) -> None:
    if args.embedded:
        args.embedded.stop()


def _once(agent, as_json: bool) -> int:
    from denpex.core import jsonio
    from denpex.core.wire import event_to_dict, evidence_to_dict

    events, evidence = agent.collect_once()
    if as_json:
        data = {
            "host": agent.config.host,
            "events": [event_to_dict(e) for e in events],
            "evidence": [evidence_to_dict(e) for e in evidence],
            "unavailable": agent.unavailable,
        }
        sys.stdout.buffer.write(jsonio.dumps(data, pretty=True) + b"\n")
        return 0
    metrics = [e for e in events if e.kind == "metric"]
    states = [e for e in events if e.kind != "metric"]
    print(
        f"{agent.config.host}: {len(agent.states)} collectors polled: "
        f"{len(evidence)} evidence, {len(metrics)} metric values, {len(states)} other events"
    )
    if evidence:
        print("evidence:")
    for item in evidence:
        where = ", ".join(
            f"{k} {v}" for k, v in (("job", item.event.job), ("rank", item.event.rank)) if v
        )
        print(
            f"  [{item.severity}] {item.category}: {item.summary or item.event.body}"
            + (f" ({where})" if where else "")
        )
    for event in states:
        print(f"  {event.source}: {event.body}")
    if len(metrics) <= MAX_METRICS_SHOWN:
        for event in metrics:
            labels = ",".join(
                f"{k}={v}" for k, v in event.attrs.items() if k not in ("value", "type")
            )
            value = event.attrs["value"]
            shown = f"{int(value)}" if float(value).is_integer() else f"{value:.4g}"
            print(f"  {event.source:<15} {event.body}{{{labels}}} {shown}")
    else:
        by_source: dict[str, int] = {}
        for event in metrics:
            by_source[event.source] = by_source.get(event.source, 0) + 1
        counts = ", ".join(f"{source} {count}" for source, count in sorted(by_source.items()))
        print(f"metrics: {counts} (all of them with --json)")
    skipped = {n: r for n, r in agent.unavailable.items() if r != DISABLED}
    if skipped:
        print("unavailable here:")
    for name, reason in skipped.items():
        print(f"  {name}: {reason}")
    return 0
