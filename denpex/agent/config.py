"""The node agent's configuration: defaults from `defaults.yaml`, a YAML file, CLI overrides.

Validation names every problem with its key, so a bad file is fixed in one edit; nothing
here starts a collector or opens a socket.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from denpex.core.roots import Roots

FSYNC_POLICIES = ("always", "batch", "never")
METRICS_ACCESS = ("token", "open")
API_KEYS = (
    "token_file",
    "metrics",
    "tls",
    "socket",
    "socket_mode",
    "socket_group",
    "max_registrations_per_user",
)
TLS_KEYS = ("cert_file", "key_file", "client_ca_file")
OTLP_PROTOCOLS = ("http/protobuf", "http/json")
COLLECTOR_KEYS = ("enabled", "interval_s", "budget_s")


class ConfigError(Exception):
    """A configuration that cannot be used; `problems` lists every reason."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(f"{source}: " + "; ".join(problems))
        self.source = source
        self.problems = problems


@dataclass(slots=True)
class CollectorConfig:
    enabled: bool = True
    interval_s: float | None = None
    budget_s: float | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class AgentConfig:
    host: str
    listen: str
    roots: Roots
    state_dir: Path
    evidence_ring: int
    metric_ttl_s: float
    signatures_local: list[str]
    otlp: dict[str, Any]
    spool: dict[str, Any]
    collectors: dict[str, CollectorConfig]
    source: str = "defaults"
    api: dict[str, Any] = field(default_factory=dict)

    def collector(self, name: str) -> CollectorConfig:
        return self.collectors.get(name) or CollectorConfig()

    @property
    def socket(self) -> str:
        """The registration socket: a path, or `@name` for an abstract one."""
        return str(self.api.get("socket") or self.state_dir / "agent.sock")


def is_loopback(host: str) -> bool:
    """Whether a listen host or a peer address is this machine only (an IPv4-mapped IPv6
    address counts as the IPv4 address it carries: `::ffff:127.0.0.1` is loopback)."""
    if host in ("localhost", ""):
        return True
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def file_mode(value: Any) -> int | None:
    """A permission mode from YAML: "0660", "0o660" or an int (YAML 1.1 reads 0660 as one)."""
    if isinstance(value, str):
        try:
            value = int(value.removeprefix("0o"), 8)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o777:
        return None
    return value


def parse_listen(text: str) -> tuple[str, int]:
    """'HOST:PORT', '[v6]:PORT' or ':PORT' (loopback) → (host, port); ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9478")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def defaults() -> dict[str, Any]:
    text = resources.files("denpex.agent").joinpath("defaults.yaml").read_text()
    return yaml.safe_load(text)


def load_config(
    path: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    known_collectors: tuple[str, ...] = (),
) -> AgentConfig:
    """Defaults, then the file at `path`, then `overrides` (dotted keys allowed:
    'roots.procfs'); raises ConfigError naming every problem."""
    data = defaults()
    source = "defaults"
    if path is not None:
        source = path
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(path, [f"cannot read: {exc.strerror}"]) from None
        except yaml.YAMLError as exc:
            raise ConfigError(path, [f"not valid YAML: {exc}"]) from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(path, ["the file must be a YAML mapping of settings"])
        problems = [f"unknown setting {k!r}" for k in (loaded or {}) if k not in data]
        if problems:
            raise ConfigError(path, problems)
        _merge(data, loaded or {})
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        target = data
        *parents, last = key.split(".")
        for parent in parents:
            target = target.setdefault(parent, {})
        target[last] = value
    return _build(data, source, known_collectors)


def _merge(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _server_settings(server: dict[str, Any], otlp: dict[str, Any]) -> list[str]:
    """`server: {url, token_file}`: the control plane as the OTLP endpoint, with its bearer
    token in the headers (read now, so SIGHUP picks up a rotated token); or
    `server: {jetstream: {servers: [nats://…]}, token_file}`: evidence published to the
    control plane's JetStream stream instead, each message signed with that token."""
    url, token_file = server.get("url"), server.get("token_file")
    jetstream = server.get("jetstream")
    if jetstream is not None:
        return _jetstream_settings(jetstream, url, token_file, otlp)
    if url is None:
        return ["server.token_file: set server.url too"] if token_file else []
    if not str(url).startswith(("http://", "https://")):
        return ["server.url: an http:// or https:// URL"]
    if otlp.get("endpoint"):
        return ["server.url and otlp.endpoint: set one of them (both are where evidence goes)"]
    headers = dict(otlp.get("headers") or {})
    if token_file is not None:
        token, problem = _read_token(token_file)
        if problem:
            return [problem]
        headers["Authorization"] = f"Bearer {token}"
    otlp["endpoint"] = str(url).rstrip("/")
    otlp["headers"] = headers
    return []


def _read_token(token_file: Any) -> tuple[str, str]:
    """(token, "") or ("", the problem)."""
    try:
        token = Path(str(token_file)).read_text().strip()
    except OSError as exc:
        return "", f"server.token_file: cannot read {token_file}: {exc.strerror}"
    if not token:
        return "", f"server.token_file: {token_file} is empty"
    return token, ""


def _jetstream_settings(
    jetstream: Any, url: Any, token_file: Any, otlp: dict[str, Any]
) -> list[str]:
    servers = jetstream.get("servers") if isinstance(jetstream, dict) else None
    if not isinstance(servers, list) or not servers:
        return ["server.jetstream.servers: a list of nats:// URLs"]
    if not all(isinstance(u, str) and u.startswith(("nats://", "tls://")) for u in servers):
        return ["server.jetstream.servers: a list of nats:// URLs"]
    if url is not None or otlp.get("endpoint"):
        return ["server.jetstream: set it instead of server.url and otlp.endpoint"]
    if token_file is None:
        return ["server.jetstream: needs server.token_file (every message is signed with it)"]
    token, problem = _read_token(token_file)
    if problem:
        return [problem]
    otlp["endpoint"] = ",".join(servers)
    otlp["jetstream"] = {"servers": list(servers), "token": token}
    return []


def _build(data: dict[str, Any], source: str, known: tuple[str, ...]) -> AgentConfig:
    problems: list[str] = []
    roots = data.get("roots") or {}
    if not isinstance(roots, dict) or set(roots) - {"procfs", "sysfs", "devfs"}:
        problems.append("roots: only procfs, sysfs and devfs can be set")
        roots = {}
    spool = dict(data.get("spool") or {})
    if spool.get("fsync") not in FSYNC_POLICIES:
        problems.append(f"spool.fsync: one of {', '.join(FSYNC_POLICIES)}")
    otlp = dict(data.get("otlp") or {})
    if otlp.get("protocol") not in OTLP_PROTOCOLS:
        problems.append(f"otlp.protocol: one of {', '.join(OTLP_PROTOCOLS)}")
    endpoint = otlp.get("endpoint")
    if endpoint is not None and not str(endpoint).startswith(("http://", "https://")):
        problems.append("otlp.endpoint: an http:// or https:// URL")
    problems.extend(_server_settings(dict(data.get("server") or {}), otlp))
    try:
        listen_host, _port = parse_listen(str(data.get("listen")))
    except ValueError as exc:
        problems.append(str(exc).replace("--listen", "listen"))
        listen_host = "127.0.0.1"
    api = dict(data.get("api") or {})
    problems += _api_problems(api, listen_host)
    for key in ("evidence_ring", "metric_ttl_s"):
        if not isinstance(data.get(key), int | float) or data[key] <= 0:
            problems.append(f"{key}: a positive number")
    collectors: dict[str, CollectorConfig] = {}
    raw_collectors = data.get("collectors") or {}
    if not isinstance(raw_collectors, dict):
        problems.append("collectors: a mapping of collector name to settings")
        raw_collectors = {}
    for name, settings in raw_collectors.items():
        if known and name not in known:
            problems.append(f"collectors.{name}: no such collector (known: {', '.join(known)})")
            continue
        settings = settings or {}
        if not isinstance(settings, dict):
            problems.append(f"collectors.{name}: a mapping of settings")
            continue
        config = CollectorConfig(
            enabled=bool(settings.get("enabled", True)),
            interval_s=settings.get("interval_s"),
            budget_s=settings.get("budget_s"),
            options={k: v for k, v in settings.items() if k not in COLLECTOR_KEYS},
        )
        for key in ("interval_s", "budget_s"):
            value = getattr(config, key)
            if value is not None and (not isinstance(value, int | float) or value <= 0):
                problems.append(f"collectors.{name}.{key}: a positive number of seconds")
        collectors[name] = config
    if problems:
        raise ConfigError(source, problems)
    return AgentConfig(
        host=str(data.get("host") or socket.gethostname()),
        listen=str(data["listen"]),
        roots=Roots(**roots),
        state_dir=Path(data["state_dir"]),
        evidence_ring=int(data["evidence_ring"]),
        metric_ttl_s=float(data["metric_ttl_s"]),
        signatures_local=[str(p) for p in data.get("signatures_local") or []],
        otlp=otlp,
        spool=spool,
        collectors=collectors,
        source=source,
        api=api,
    )


def _api_problems(api: dict[str, Any], listen_host: str) -> list[str]:
    problems = [
        f"api.{k}: unknown setting (known: {', '.join(API_KEYS)})" for k in api if k not in API_KEYS
    ]
    if api.get("metrics") not in METRICS_ACCESS:
        problems.append(f"api.metrics: one of {', '.join(METRICS_ACCESS)}")
    tls = api.get("tls")
    if tls is not None:
        if not isinstance(tls, dict) or set(tls) - set(TLS_KEYS):
            problems.append(f"api.tls: a mapping of {', '.join(TLS_KEYS)}")
        elif not (tls.get("cert_file") and tls.get("key_file")):
            problems.append("api.tls: cert_file and key_file are both needed")
    mode = file_mode(api.get("socket_mode"))
    if mode is None:
        problems.append('api.socket_mode: an octal file mode such as "0660"')
    else:
        api["socket_mode"] = mode
    cap = api.get("max_registrations_per_user")
    if not isinstance(cap, int) or cap <= 0:
        problems.append("api.max_registrations_per_user: a positive number")
    mtls = isinstance(tls, dict) and bool(tls.get("client_ca_file"))
    if not is_loopback(listen_host) and not api.get("token_file") and not mtls:
        problems.append(
            f"listen {listen_host}: reachable from other hosts, and evidence names every "
            "tenant's jobs: set api.token_file (or api.tls with a client_ca_file), or listen "
            "on 127.0.0.1"
        )
    return problems
