"""NVIDIA UFM Enterprise REST client and the "ufm" collector: this node's InfiniBand ports as
UFM sees them, and new UFM alarms and events about them. Only GETs, each with a timeout; never
logs the password or token; a blind (unreachable, refusing) UFM shows in `degraded()`.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from denpex.core.collector import CollectContext, Observation
from denpex.core.events import Event, metric
from denpex.core.roots import Roots
from denpex.fabric.base import FabricCollector
from denpex.fabric.ufm.detect import (
    HELP,
    UfmState,
    alarm_evidence,
    category_problems,
    in_scope,
    parse_ufm_time,
    parse_width,
    port_evidence,
    port_is_up,
    port_metrics,
)

log = logging.getLogger(__name__)

__all__ = [
    "HELP",
    "UfmClient",
    "UfmCollector",
    "UfmError",
    "local_guids",
    "normalise_guid",
    "parse_ufm_time",
    "parse_width",
    "read_secret",
]


class UfmError(Exception):
    """A request to UFM failed; the message says what happened and what to do next."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def normalise_guid(text: str) -> str:
    """`248a:0703:008a:850a` or `0x248a0703008a850a` → `248a0703008a850a`."""
    return text.strip().lower().removeprefix("0x").replace(":", "")


def local_guids(roots: Roots) -> set[str]:
    """Node and port GUIDs of this host's HCAs: <sysfs>/class/infiniband/*/node_guid and the
    low 64 bits of every port's GID 0 (UFM names ports `<guid>_<port number>`)."""
    out: set[str] = set()
    folder = roots.sys("class", "infiniband")
    try:
        devices = sorted(os.listdir(folder))
    except OSError:
        return out
    for device in devices:
        try:
            out.add(normalise_guid((folder / device / "node_guid").read_text()))
        except OSError:
            pass
        try:
            ports = sorted(os.listdir(folder / device / "ports"))
        except OSError:
            continue
        for port in ports:
            try:
                gid = (folder / device / "ports" / port / "gids" / "0").read_text().strip()
            except OSError:
                continue
            low = normalise_guid(gid)[-16:]
            if len(low) == 16 and low.strip("0"):
                out.add(low)
    return out


def read_secret(options: Mapping[str, Any], name: str) -> str | None:
    """A secret from `<name>_file` (a file's first line) or `<name>_env` (an environment
    variable); never from the config itself, so that it stays out of config dumps."""
    path = options.get(f"{name}_file")
    if path:
        try:
            return Path(path).read_text().splitlines()[0].strip()
        except (OSError, IndexError):
            return None
    env = options.get(f"{name}_env")
    if env:
        return os.environ.get(str(env)) or None
    return None


class UfmClient:
    """GET requests to one UFM server (urllib, one connection per request). Basic auth goes
    to `/ufmRest`, a UFM access token (`Authorization: Basic <token>`) to `/ufmRestV3`."""

    def __init__(
        self,
        url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        timeout_s: float = 5.0,
        ca_file: str | None = None,
        insecure_skip_verify: bool = False,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        if token:
            self.base = "/ufmRestV3"
            self._authorization = f"Basic {token}"
        elif username:
            pair = f"{username}:{password or ''}".encode()
            self.base = "/ufmRest"
            self._authorization = "Basic " + base64.b64encode(pair).decode()
        else:
            raise ValueError("UFM needs username (with password_file or password_env) or token")
        self.auth_kind = "token" if token else "basic"
        self._ssl: ssl.SSLContext | None = None
        if self.url.startswith("https:"):
            self._ssl = ssl.create_default_context(cafile=ca_file)
            if insecure_skip_verify:
                self._ssl.check_hostname = False
                self._ssl.verify_mode = ssl.CERT_NONE

    def __repr__(self) -> str:  # never shows the credentials
        return f"UfmClient({self.url!r}, auth={self.auth_kind})"

    def get(self, path: str, query: Mapping[str, str] | None = None, *, deadline: float) -> Any:
        """The decoded JSON of GET <base><path>; raises UfmError with a message a person
        can act on. `deadline` (time.monotonic()) bounds the request with the poll's budget."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise UfmError(f"UFM at {self.url}: no time left in this poll for {path}")
        target = f"{self.url}{self.base}{path}"
        if query:
            target += "?" + urllib.parse.urlencode(query)
        request = urllib.request.Request(
            target,
            headers={"Authorization": self._authorization, "Accept": "application/json"},
        )
        timeout = min(self.timeout_s, remaining)
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self._ssl) as reply:
                body = reply.read()
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc.code, path) from None
        except (TimeoutError, urllib.error.URLError, OSError) as exc:
            raise UfmError(self._connection_error(exc, path, timeout)) from None
        try:
            return json.loads(body)
        except ValueError:
            raise UfmError(
                f"UFM at {self.url} sent a response to {path} that is not JSON"
            ) from None

    def _http_error(self, status: int, path: str) -> UfmError:
        if status in (401, 403):
            how = "token" if self.auth_kind == "token" else "username and password"
            return UfmError(
                f"UFM at {self.url} refused the {how} (HTTP {status}) for {path}: check the "
                "credentials in the ufm collector's config (password_file/password_env or "
                "token_file/token_env)",
                status=status,
            )
        return UfmError(f"UFM at {self.url} answered HTTP {status} for {path}", status=status)

    def _connection_error(self, exc: BaseException, path: str, timeout: float) -> str:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, TimeoutError):
            return f"UFM at {self.url} did not answer {path} within {timeout:g} s"
        if isinstance(reason, ssl.SSLCertVerificationError):
            return (
                f"UFM at {self.url}: TLS certificate not trusted ({reason.verify_message}); "
                "set ca_file to the CA that signed it"
            )
        return f"cannot reach UFM at {self.url} ({reason})"

    def ports(self, *, system: str | None = None, deadline: float) -> list[dict[str, Any]]:
        data = self.get(
            "/resources/ports", {"system": system} if system else None, deadline=deadline
        )
        return [p for p in data if isinstance(p, dict)] if isinstance(data, list) else []

    def alarms(self, *, deadline: float) -> list[dict[str, Any]]:
        data = self.get("/app/alarms", deadline=deadline)
        return [a for a in data if isinstance(a, dict)] if isinstance(data, list) else []

    def events(self, *, deadline: float) -> list[dict[str, Any]]:
        data = self.get("/app/events", deadline=deadline)
        return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []


class UfmCollector(FabricCollector):
    name = "ufm"
    stability = "experimental"
    default_interval_s = 60.0
    default_budget_s = 20.0
    metrics_help = HELP

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(roots, options)
        self._client: UfmClient | None = None
        self._config_error: str | None = None
        self._blind: str | None = None
        self._own_ports: list[dict[str, Any]] = []  # this host's HCA ports, last poll
        self._state = UfmState.load(self._state_path())
        try:
            self._client = self._make_client()
        except ValueError as exc:
            self._config_error = str(exc)
        problems = category_problems(self.options)
        if problems:
            self._client, self._config_error = None, "; ".join(problems)

    def _make_client(self) -> UfmClient:
        url = self.options.get("url")
        if not url:
            raise ValueError("no UFM url configured (collectors.ufm.url: https://<ufm-host>)")
        if self.options.get("insecure_skip_verify"):
            # loud on purpose: a man in the middle could feed fake fabric state
            log.warning("ufm: TLS verification of %s is OFF (insecure_skip_verify)", url)
        password = read_secret(self.options, "password")
        token = read_secret(self.options, "token")
        username = self.options.get("username")
        if username and password is None and not token:
            raise ValueError(
                "UFM username given but no password: set password_file or password_env"
            )
        return UfmClient(
            str(url),
            username=username,
            password=password,
            token=token,
            timeout_s=float(self.options.get("timeout_s", 5.0)),
            ca_file=self.options.get("ca_file"),
            insecure_skip_verify=bool(self.options.get("insecure_skip_verify")),
        )

    def _state_path(self) -> Path | None:
        folder = self.options.get("state_dir")
        return Path(folder, "ufm-state.json") if folder else None

    def available(self) -> tuple[bool, str]:
        if self._client is None:
            return False, self._config_error or "UFM client not configured"
        return True, f"ports, alarms and events from UFM at {self._client.url}"

    def degraded(self) -> str | None:
        return self._blind

    def host_facts(self) -> Mapping[str, str]:
        """The leaf switch this host's HCA ports connect to (UFM's peer node name and GUID
        of its up ports; the one most of them reach), for the fleet rules' topology."""
        peers = Counter(
            (str(p.get("peer_node_name") or ""), normalise_guid(str(p.get("peer_guid") or "")))
            for p in self._own_ports
            if port_is_up(p) and p.get("peer_node_name")
        )
        if not peers:
            return {}
        (name, guid), _ = max(peers.items(), key=lambda item: (item[1], item[0]))
        return {"switch": name, **({"switch_guid": guid} if guid else {})}

    def collect(self, ctx: CollectContext) -> list[Observation]:
        if self._client is None:
            return []
        deadline = time.monotonic() + float(self.options.get("poll_budget_s", 15.0))
        guids = {normalise_guid(g) for g in self.options.get("node_guids") or []}
        guids |= local_guids(ctx.roots) if not guids else set()
        systems = [str(s) for s in self.options.get("systems") or []]
        try:
            ports = self._ports(sorted(guids), systems, deadline)
            alarms = self._client.alarms(deadline=deadline)
            events = (
                self._client.events(deadline=deadline) if self.options.get("events", True) else []
            )
        except UfmError as exc:
            return self._went_blind(ctx, str(exc))
        out: list[Observation] = []
        if self._blind is not None:
            self._blind = None
            out.append(self._state_event(ctx, f"UFM at {self._client.url} answers again"))
        self._own_ports = [
            p
            for p in ports
            if normalise_guid(str(p.get("guid") or p.get("system_id") or "")) in guids
        ]
        out += port_metrics(ctx, ports, self.options.get("lane_rate_gbps") or {})
        out += port_evidence(ctx, ports, self.options, self._state)
        scope = in_scope(ports, guids, systems)
        out += alarm_evidence(ctx, alarms, events, scope, self.options, self._state)
        self._state.save(self._state_path())
        return out

    def _ports(self, guids: list[str], systems: list[str], deadline: float) -> list[dict[str, Any]]:
        assert self._client is not None
        if not guids and not systems:
            raise UfmError(
                "no HCA found under <sysfs>/class/infiniband and no node_guids or systems "
                "configured: nothing to ask UFM about"
            )
        seen: dict[str, dict[str, Any]] = {}
        for system in [*guids, *systems]:
            for port in self._client.ports(system=system, deadline=deadline):
                seen[str(port.get("name") or port.get("guid"))] = port
        return list(seen.values())

    def _went_blind(self, ctx: CollectContext, why: str) -> list[Observation]:
        first = self._blind is None
        self._blind = why
        up = metric("ufm_up", 0, source="ufm", host=ctx.host, ts_ns=ctx.now_ns)
        return [up, self._state_event(ctx, why)] if first else [up]

    def _state_event(self, ctx: CollectContext, body: str) -> Event:
        return Event(
            body=body,
            ts_ns=ctx.now_ns,
            host=ctx.host,
            source="ufm",
            kind="state",
            attrs={
                "ufm": self._client.url if self._client else "",
                "blind": self._blind is not None,
            },
        )
