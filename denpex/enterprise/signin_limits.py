"""Rate limits on refused sign-ins: each source (client address) and each account (token id,
person) may be refused `refusals` times in a fixed window of `window_s`; after that every
sign-in it tries is answered 429 until the window ends, and the crossing is reported once per
window (the caller audits it once, not per attempt). The limits are data (signin_limits.yaml).

Pure bookkeeping on a clock it is given: no I/O, no credentials kept (keys are ids and
addresses), bounded memory (`max_tracked`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

SCOPES = ("source", "account")


@dataclass(frozen=True, slots=True)
class Limit:
    refusals: int
    window_s: float


@dataclass(frozen=True, slots=True)
class SignInLimits:
    per_source: Limit
    per_account: Limit
    max_tracked: int = 100_000

    def of(self, scope: str) -> Limit:
        return self.per_source if scope == "source" else self.per_account

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "signin limits") -> SignInLimits:
        try:
            limits = {
                scope: Limit(int(raw[scope]["refusals"]), float(raw[scope]["window_s"]))
                for scope in ("per_source", "per_account")
            }
            made = cls(
                limits["per_source"], limits["per_account"], int(raw.get("max_tracked", 100_000))
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: missing or malformed {exc}") from None
        for limit in limits.values():
            if limit.refusals < 1 or limit.window_s <= 0:
                raise ValueError(f"{where}: refusals must be >= 1 and window_s > 0")
        return made

    @classmethod
    def load(cls, path: str | Path | None = None) -> SignInLimits:
        """The limits of `path`, else the packaged signin_limits.yaml."""
        if path is None:
            text = resources.files("denpex.enterprise").joinpath("signin_limits.yaml").read_text()
            return cls.from_dict(yaml.safe_load(text), "signin_limits.yaml")
        return cls.from_dict(yaml.safe_load(Path(path).read_text()) or {}, str(path))


Key = tuple[str, str]  # (scope, value): ("source", "10.0.0.7"), ("account", "token:ab12")


@dataclass(frozen=True, slots=True)
class Crossed:
    """A key that reached its limit with this refusal: report it (once per window)."""

    scope: str
    value: str
    refusals: int
    window_s: float
    until: float  # the clock time its window ends


class RefusedSignIns:
    def __init__(
        self, limits: SignInLimits, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: OrderedDict[Key, tuple[float, int]] = OrderedDict()  # key → (start, n)

    def _current(self, key: Key, now: float) -> tuple[float, int]:
        window = self.limits.of(key[0]).window_s
        start, count = self._windows.get(key, (now, 0))
        if now - start >= window:
            start, count = now, 0
        return start, count

    def wait_s(self, keys: Iterable[Key]) -> float | None:
        """Seconds until the longest-blocked of `keys` may try again; None when none is."""
        now = self._clock()
        wait = 0.0
        with self._lock:
            for key in keys:
                start, count = self._current(key, now)
                limit = self.limits.of(key[0])
                if count >= limit.refusals:
                    wait = max(wait, start + limit.window_s - now)
        return wait if wait > 0 else None

    def refuse(self, keys: Iterable[Key]) -> list[Crossed]:
        """Count a refused sign-in against each key; the keys it brought to their limit."""
        now = self._clock()
        crossed: list[Crossed] = []
        with self._lock:
            for key in keys:
                start, count = self._current(key, now)
                count += 1
                self._windows[key] = (start, count)
                self._windows.move_to_end(key)
                limit = self.limits.of(key[0])
                if count == limit.refusals:
                    crossed.append(
                        Crossed(
                            key[0], key[1], limit.refusals, limit.window_s, start + limit.window_s
                        )
                    )
            while len(self._windows) > self.limits.max_tracked:
                self._windows.popitem(last=False)
        return crossed
