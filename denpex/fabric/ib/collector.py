"""InfiniBand and RoCE ports from sysfs (`<sysfs>/class/infiniband/*/ports/*`): state, rate,
port counters and hw_counters as metrics; link flaps, ports down or slower than their peers,
and rising error counters (symbol errors before a link drops) as evidence.

Reads small sysfs attributes only; never resets a counter, never sends a MAD of its own.
Each counters/ file costs a firmware query on mlx5, so only the flap and early-warning
counters are read every poll, the rest every `full_counters_every` polls.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from denpex.core.collector import CollectContext, Observation, settings
from denpex.core.roots import Roots
from denpex.fabric.base import FabricCollector
from denpex.fabric.counters import CounterTracker
from denpex.fabric.ib.detect import PortMemory, port_observations, threshold_problems
from denpex.fabric.ib.ports import HELP, STATE_FILE, expected_rates, rdma_ports, read_port


class IbCollector(FabricCollector):
    name = "ib"
    stability = "experimental"
    default_interval_s = 5.0  # a flap must become evidence within 10 s
    default_budget_s = 2.0
    metrics_help = HELP

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(roots, options)
        # a width given in the agent's config adds to the known ones instead of replacing all
        known = settings(self.settings_file or "", self.name).get("counter_bits") or {}
        self.options["counter_bits"] = {**known, **(self.options.get("counter_bits") or {})}
        self.tracker = CounterTracker()
        self.memory: dict[str, PortMemory] = {}
        self.polls = 0
        state_dir = self.options.get("state_dir")
        self.state_path = Path(state_dir, STATE_FILE) if state_dir else None

    def available(self) -> tuple[bool, str]:
        problems = threshold_problems(self.options.get("error_thresholds") or {})
        if problems:
            return False, "; ".join(problems)
        base = self.roots.sys("class", "infiniband")
        ports = rdma_ports(self.roots)
        if not ports:
            return False, f"no RDMA ports under {base} (no InfiniBand/RoCE device or driver)"
        return True, f"{len(ports)} RDMA port(s) under {base}"

    def collect(self, ctx: CollectContext) -> list[Observation]:
        if self.polls == 0:
            self._restore(ctx.now_ns)
        full = self.polls % max(1, int(self.options["full_counters_every"])) == 0
        self.polls += 1
        names = list(self.options["counters_every_poll"])
        if full:
            names += [n for n in self.options["counters"] if n not in names]
        hw_names = list(self.options["hw_counters"]) if full else []
        readings = [read_port(d, p, f, names, hw_names) for d, p, f in rdma_ports(ctx.roots)]
        expected = expected_rates(
            readings, self.options.get("expected_rate_gbps"), int(self.options["min_peers"])
        )
        out: list[Observation] = []
        for reading in readings:
            memory = self.memory.setdefault(reading.key, PortMemory())
            out += port_observations(
                ctx, reading, memory, self.tracker, self.options, expected.get(reading.link_layer)
            )
        self._save(ctx.now_ns)
        return out

    # -- persistence: a restarted agent (or a second `--once` with a state_dir) compares
    # against the counters it saw last, so flaps in between are not lost -------------------
    def _restore(self, now_ns: int) -> None:
        if self.state_path is None:
            return
        try:
            data = json.loads(self.state_path.read_text())
            saved_ns = int(data["ts_ns"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        if not 0 <= now_ns - saved_ns <= float(self.options["state_max_age_s"]) * 1e9:
            return
        counters, ports = data.get("counters"), data.get("ports")
        if not isinstance(counters, dict) or not isinstance(ports, dict):
            return
        self.tracker.restore(counters)
        for key, port in ports.items():
            if isinstance(port, dict):
                state = port.get("state")
                self.memory[str(key)] = PortMemory(
                    state=state if isinstance(state, int) else None,
                    seen_active=bool(port.get("seen_active")),
                    down_reported=bool(port.get("down_reported")),
                )

    def _save(self, now_ns: int) -> None:
        if self.state_path is None:
            return
        data = {
            "ts_ns": now_ns,
            "counters": self.tracker.snapshot(),
            "ports": {
                key: {
                    "state": m.state,
                    "seen_active": m.seen_active,
                    "down_reported": m.down_reported,
                }
                for key, m in self.memory.items()
            },
        }
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.state_path)
        except OSError:
            pass  # persistence is a convenience: the next poll still compares in memory
