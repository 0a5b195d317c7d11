"""The node agent's configuration: defaults from `defaults.yaml`, a YAML file, CLI overrides.

Validation names every problem with its key, so a bad file is fixed in one edit; nothing
here starts a collector or opens a socket.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from denpex.core.roots import Roots

FSYNC_POLICIES = ("always", "batch", "never")
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

    def collector(self, name: str) -> CollectorConfig:
        return self.collectors.get(name) or CollectorConfig()


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
    token in the headers (read now, so SIGHUP picks up a rotated token)."""
    url, token_file = server.get("url"), server.get("token_file")
    if url is None:
        return ["server.token_file: set server.url too"] if token_file else []
    if not str(url).startswith(("http://", "https://")):
        return ["server.url: an http:// or https:// URL"]
    if otlp.get("endpoint"):
        return ["server.url and otlp.endpoint: set one of them (both are where evidence goes)"]
    headers = dict(otlp.get("headers") or {})
    if token_file is not None:
        try:
            token = Path(str(token_file)).read_text().strip()
        except OSError as exc:
            return [f"server.token_file: cannot read {token_file}: {exc.strerror}"]
        if not token:
            return [f"server.token_file: {token_file} is empty"]
        headers["Authorization"] = f"Bearer {token}"
    otlp["endpoint"] = str(url).rstrip("/")
    otlp["headers"] = headers
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
        parse_listen(str(data.get("listen")))
    except ValueError as exc:
        problems.append(str(exc).replace("--listen", "listen"))
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
    )
