"""Warm spares: hosts held out of the pool by the backend (a denpex reason), validated by a
preflight (spares.yaml: DCGM level 1, an all-reduce across the spares, InfiniBand port state),
offered to a plan's reroute only when the preflight passed within `max_age_s`, and checked
again right before they are resumed into service. A spare that fails is sent to diagnostics
and stays out.

It must never hand out a spare whose last preflight failed or is stale, never resume a host
it did not enroll, and never run a check it was not given (the checks are data).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

from denpex.remediation.backend import Backend, BackendError, Target, TargetKind

VALIDATED, UNCHECKED, FAILED, TAKEN = "validated", "unchecked", "failed", "taken"
# a spare a human asked for (not held out yet), and one a human asked to give back: the
# control plane stores these; the leader's pass enrolls or releases them
REQUESTED, REMOVING = "requested", "removing"


@cache
def settings() -> Mapping[str, Any]:
    text = resources.files("denpex.remediation").joinpath("spares.yaml").read_text()
    return dict(yaml.safe_load(text))


@dataclass(frozen=True)
class Check:
    name: str
    command: tuple[str, ...]
    explain: str = ""


def checks_from(data: Sequence[Mapping[str, Any]]) -> tuple[Check, ...]:
    return tuple(
        Check(str(c["name"]), tuple(str(a) for a in c["command"]), str(c.get("explain", "")))
        for c in data
    )


@dataclass
class Spare:
    host: str
    pool: str | None
    status: str = UNCHECKED
    validated_at: float | None = None  # the clock's seconds at the last passed preflight
    checked_at: float | None = None  # ... at the last preflight, passed or not
    results: list[dict[str, Any]] = field(default_factory=list)  # the last preflight's checks


class SparePool:
    def __init__(
        self,
        backend: Backend,
        *,
        checks: Sequence[Check] | None = None,
        max_age_s: float | None = None,
        timeout_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        conf = settings()
        self.backend = backend
        self.checks = tuple(checks) if checks is not None else checks_from(conf["checks"])
        self.max_age_s = float(max_age_s if max_age_s is not None else conf["max_age_s"])
        self.timeout_s, self.clock = timeout_s, clock
        self.spares: dict[str, Spare] = {}

    def _target(self, spare: Spare) -> Target:
        return Target(TargetKind.HOST, spare.host, None, spare.pool)

    def enroll(self, host: str, pool: str | None = None) -> Spare:
        """Hold `host` out of service as a spare (the backend's cordon, our reason)."""
        spare = Spare(host, pool)
        out = self.backend.cordon(self._target(spare), reason=settings()["reason"], timeout_s=60)
        if not out.ok:
            raise BackendError(f"spares: {host} could not be held out of service: {out.detail}")
        self.spares[host] = spare
        return spare

    def _run(self, check: Check, spare: Spare) -> dict[str, Any]:
        group = ",".join(sorted(self.spares))
        argv = [a.format(host=spare.host, spares=group) for a in check.command]
        started = time.monotonic()
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s)
            code, output = done.returncode, (done.stdout + done.stderr)[-2000:]
        except FileNotFoundError:
            code, output = 127, f"{argv[0]}: not found"
        except subprocess.TimeoutExpired:
            code, output = 124, f"did not finish in {self.timeout_s:g} s"
        return {
            "check": check.name,
            "command": argv,
            "passed": code == 0,
            "returncode": code,
            "output": output,
            "seconds": round(time.monotonic() - started, 3),
        }

    def preflight(self, host: str) -> bool:
        """Run every check on the spare; a failure sends it to diagnostics and keeps it out."""
        spare = self.spares[host]
        spare.results = [self._run(check, spare) for check in self.checks]
        spare.checked_at = self.clock()
        if all(r["passed"] for r in spare.results):
            spare.status, spare.validated_at = VALIDATED, self.clock()
            return True
        spare.status, spare.validated_at = FAILED, None
        target = self._target(spare)
        self.backend.cordon(target, reason=settings()["failed_reason"], timeout_s=60)
        level = int(settings()["diagnostics_level"])
        try:
            diag = self.backend.run_diagnostics(target, level=level, timeout_s=self.timeout_s)
            spare.results.append({"check": "diagnostics", "passed": diag.ok, **diag.record})
        except BackendError as exc:
            spare.results.append({"check": "diagnostics", "passed": False, "error": str(exc)})
        return False

    def validate_all(self) -> dict[str, bool]:
        """The periodic pass: every spare not taken is checked again."""
        return {h: self.preflight(h) for h, s in sorted(self.spares.items()) if s.status != TAKEN}

    def due(self) -> list[str]:
        """The spares not taken whose last preflight is older than `max_age_s` (or never
        ran): the periodic pass checks these again."""
        now = self.clock()
        return [
            h
            for h, s in sorted(self.spares.items())
            if s.status != TAKEN and (s.checked_at is None or now - s.checked_at > self.max_age_s)
        ]

    def release(self, host: str, *, reason: str) -> bool:
        """Give a spare back to service (a human removed it from the pool): a spare not taken
        is resumed in the backend; True when it left the pool."""
        spare = self.spares[host]
        if spare.status != TAKEN:
            out = self.backend.resume(self._target(spare), reason=reason, timeout_s=60)
            if not out.ok:
                return False
        del self.spares[host]
        return True

    def fresh(self, spare: Spare) -> bool:
        return (
            spare.status == VALIDATED
            and spare.validated_at is not None
            and self.clock() - spare.validated_at <= self.max_age_s
        )

    def take(self, pool: str | None, *, exclude: Sequence[str] = (), reason: str) -> Spare | None:
        """A validated spare of `pool`, checked again (preflight before resume) and resumed
        into service for the rerouted job; None when no spare passes."""
        for spare in sorted(self.spares.values(), key=lambda s: (not self.fresh(s), s.host)):
            if spare.status in (TAKEN, REMOVING) or spare.host in exclude:
                continue
            if pool and spare.pool and spare.pool != pool:  # a spare of no pool stands in for any
                continue
            if spare.status == FAILED or not self.preflight(spare.host):
                continue
            out = self.backend.resume(self._target(spare), reason=reason, timeout_s=60)
            if out.ok:
                spare.status = TAKEN
                return spare
        return None
