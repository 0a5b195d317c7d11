"""A seeded GPU fleet for the replay benchmark (bench_fleet.py): hosts with 8 GPUs behind
leaf switches and racks, ~200 jobs a day, faults of known truth and healthy noise.

It emits what the agents and `denpex run` send — OTLP/HTTP log requests built by
denpex.agent.otlp from evidence the real catalog matched, and job reports whose
`denpex.diagnosis/v1` the real scanner and engine produced from the job's log lines — and
reacts to drains and fixes the way a site would. Never used by the test suite's fast path.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from typing import Any

from fleet_lines import check_lines
from fleet_records import (
    DAY,
    GPU_BUSES,
    HOUR,
    IMAGES,
    NEW_DRIVER,
    OLD_DRIVER,
    START_NS,
    Delivery,
    Fault,
    HostRecord,
    Job,
    S,
    SimConfig,
)
from fleet_wire import ib_warning, job_report, kmsg_evidence, otlp_logs

from denpex.catalog import Catalog, load_catalog
from denpex.control.fleet.model import Placement
from denpex.core.events import Evidence


class World:
    """The fleet, advanced in time by `advance(until_ns)`; `act` applies a site's response."""

    def __init__(self, cfg: SimConfig, catalog: Catalog | None = None) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.catalog = catalog or load_catalog()
        check_lines(self.catalog)
        self.now = START_NS
        self.end = START_NS + int(cfg.days * DAY)
        self._queue: list[tuple[int, int, str, Any]] = []
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self.out: list[Delivery] = []
        self.hosts: dict[str, HostRecord] = {}
        for i in range(cfg.hosts):
            name = f"gpu-node-{i:03d}"
            record = HostRecord(
                name,
                i,
                f"leaf-{i // cfg.hosts_per_switch:02d}",
                f"rack-{i // cfg.hosts_per_rack:02d}",
            )
            record.serials = [f"165{cfg.seed:02d}{i:04d}{g}" for g in range(8)]
            self.hosts[name] = record
        self.kmsg_hosts = {h for h in self.hosts if self.rng.random() < cfg.kmsg_visible}
        self.jobs: dict[str, Job] = {}
        self.pending: list[Job] = []
        self.finished: list[Job] = []
        self.faults: list[Fault] = []
        self.drains: list[tuple[int, str, bool]] = []  # (time, host, truly faulty)
        self._inject_faults()
        self._schedule_arrivals()
        self._schedule_noise()

    # -- topology and labels, as a site topology file and the agents would give them -----
    def topology(self) -> dict[str, Placement]:
        rails = {f"0000:{bus}:00.0": f"rail-{g}" for g, bus in enumerate(GPU_BUSES)}
        return {
            h.name: Placement(
                host=h.name, rack=h.rack, switch=h.switch, pdu=f"pdu-{h.rack[5:]}", rails=rails
            )
            for h in self.hosts.values()
        }

    # -- events ----------------------------------------------------------------------------
    def _at(self, ts: int, kind: str, data: Any = None) -> None:
        heapq.heappush(self._queue, (ts, next(self._seq), kind, data))

    def _exp(self, mean_ns: float) -> int:
        return int(self.rng.expovariate(1.0 / mean_ns))

    def _inject_faults(self) -> None:
        cfg, rng = self.cfg, self.rng
        names = sorted(self.hosts)
        span = int(cfg.days * DAY)
        chosen = rng.sample(names, cfg.xid_gpus + cfg.bad_memory_hosts)
        for host in chosen[: cfg.xid_gpus]:
            g = rng.randrange(8)
            start = START_NS + int(rng.uniform(0.5, 0.6 * cfg.days) * DAY)
            fault = Fault("gpu", self.hosts[host].serials[g], host, start, gpu=g)
            self.faults.append(fault)
            self._at(start + self._exp(20 * HOUR), "xid", fault)
        for host in chosen[cfg.xid_gpus :]:
            start = START_NS + int(rng.uniform(0.5, 0.6 * cfg.days) * DAY)
            fault = Fault("host", host, host, start)
            self.faults.append(fault)
            self._at(start + self._exp(10 * HOUR), "edac", fault)
        switches = sorted({h.switch for h in self.hosts.values()})
        for switch in rng.sample(switches, cfg.flapping_switches):
            start = START_NS + int(rng.uniform(1.0, 0.6 * cfg.days) * DAY)
            fault = Fault("switch", switch, None, start)
            self.faults.append(fault)
            self._at(start + self._exp(4 * HOUR), "flap", fault)
        if cfg.rollout_share > 0:
            start = START_NS + int(cfg.rollout_day * DAY)
            fault = Fault("driver", f"driver={NEW_DRIVER}", None, start)
            self.faults.append(fault)
            targets = rng.sample(names, round(cfg.rollout_share * len(names)))
            for host in targets:  # rolled out host by host over six hours
                self._at(start + int(rng.uniform(0, 6) * HOUR), "rollout", host)
        assert span > 0

    def _schedule_arrivals(self) -> None:
        t = START_NS
        mean = DAY / self.cfg.jobs_per_day
        while t < self.end:
            t += self._exp(mean)
            self._at(t, "arrive", None)
        for day in range(int(self.cfg.days)):  # a few sweeps a week: one workload, many jobs
            if self.rng.random() < 0.4:
                self._at(START_NS + day * DAY + int(self.rng.uniform(8, 20) * HOUR), "sweep", None)

    def _schedule_noise(self) -> None:
        per_day = {  # transient agent events on healthy hosts, fleet-wide per day
            "ib_warning": 10.0,
            "edac_ce": 4.0,
            "link_down_warning": 2.0,
            "row_remap_pending": 0.5,
            "link_flap_kill": 1.0,
        }
        for kind, rate in per_day.items():
            t = START_NS
            while True:
                t += self._exp(DAY / rate)
                if t >= self.end:
                    break
                self._at(t, "noise", kind)

    def advance(self, until_ns: int) -> list[Delivery]:
        """Runs the world up to `until_ns`; returns what was sent meanwhile, in time order."""
        until_ns = min(until_ns, self.end)
        while self._queue and self._queue[0][0] <= until_ns:
            ts, _, kind, data = heapq.heappop(self._queue)
            self.now = ts
            getattr(self, f"_on_{kind}")(data)
        self.now = until_ns
        out, self.out = self.out, []
        out.sort(key=lambda d: d.ts_ns)
        return out

    @property
    def done(self) -> bool:
        return self.now >= self.end

    # -- jobs ------------------------------------------------------------------------------
    def _job_spec(self, name: str | None = None, user: str | None = None) -> Job:
        rng = self.rng
        size = rng.choices((1, 2, 4, 8, 16, 32), weights=(30, 20, 20, 15, 10, 5))[0]
        hours = min(48.0, math.exp(rng.gauss(math.log(3.0), 1.0)))
        number = next(self._ids)
        return Job(
            ident=f"{700000 + number}",
            name=name or f"wl-{int(rng.paretovariate(1.2)) % 80:02d}",
            user=user or f"user{rng.randrange(24):02d}",
            image=rng.choice(IMAGES),
            hosts=[],
            start_ns=0,
            end_ns=int(hours * HOUR),
            size=size,
        )

    def _on_arrive(self, _data: Any) -> None:
        self.pending.append(self._job_spec())
        self._start_pending()

    def _on_sweep(self, _data: Any) -> None:
        name, user = f"sweep-{next(self._ids)}", f"user{self.rng.randrange(24):02d}"
        category = self.rng.choice(("env.import_error", "app.exception", "env.config_error"))
        for _ in range(self.rng.randrange(6, 14)):
            job = self._job_spec(name, user)
            job.cause, job.size = ("software", category), 1
            job.end_ns = int(self.rng.uniform(1, 5) * 60 * S)
            self.pending.append(job)
        self._start_pending()

    def _free_hosts(self) -> list[str]:
        return [h.name for h in self.hosts.values() if h.busy is None and not h.drained]

    def _start_pending(self) -> None:
        while self.pending:
            job = self.pending[0]
            free = self._free_hosts()
            size = job.size
            if len(free) < size:
                return
            self.pending.pop(0)
            # topology-aware placement half the time: fill one switch first
            if self.rng.random() < 0.5:
                free.sort(key=lambda h: (self.hosts[h].switch, self.rng.random()))
                at = self.rng.randrange(len(free))
                picked = (free[at:] + free[:at])[:size]
            else:
                picked = self.rng.sample(free, size)
            self._start(job, picked)

    def _start(self, job: Job, hosts: list[str]) -> None:
        now = self.now
        job.hosts, job.start_ns = hosts, now
        duration = job.end_ns
        job.end_ns = now + duration
        for host in hosts:
            self.hosts[host].busy = job.ident
        self.jobs[job.ident] = job
        if job.cause[0] == "software":
            job.root_host = hosts[0]
        else:
            self._draw_failure(job, duration)
        job.driver = self.hosts[job.root_host or hosts[0]].driver
        self._at(job.end_ns, "end", (job.ident, job.version))

    def _draw_failure(self, job: Job, duration: int) -> None:
        """What ends the job from the inside: its own code, a bad host, the bad driver."""
        rng, now = self.rng, self.now
        first: tuple[int, tuple[str, ...], str] | None = None

        def offer(ts: int, cause: tuple[str, ...], host: str) -> None:
            nonlocal first
            if ts < now + duration and (first is None or ts < first[0]):
                first = (ts, cause, host)

        if rng.random() < self.cfg.software_failure:
            category = rng.choices(
                (
                    "app.exception",
                    "cuda.oom",
                    "env.import_error",
                    "env.config_error",
                    "train.nan_loss",
                    "data.corrupt_input",
                    "ckpt.load_failure",
                    "host.segfault",
                    "cuda.illegal_address",
                ),
                weights=(28, 20, 8, 8, 10, 6, 6, 8, 6),
            )[0]
            early = rng.random() < 0.4
            ts = now + (
                int(rng.uniform(1, 15) * 60 * S) if early else int(rng.uniform(0, duration))
            )
            host = job.hosts[0] if rng.random() < 0.5 else rng.choice(job.hosts)
            offer(ts, ("software", category), host)
        if rng.random() < 0.03:
            offer(now + duration - 1, ("software", "job.time_limit"), job.hosts[0])
        elif rng.random() < 0.02:
            offer(now + int(rng.uniform(0, duration)), ("software", "job.preempted"), job.hosts[0])
        for fault in self.faults:
            if fault.kind == "host" and fault.host in job.hosts and fault.active(now):
                category = rng.choice(("host.segfault", "cuda.illegal_address", "app.exception"))
                offer(
                    now + self._exp(3 * HOUR),
                    ("fault", "host", fault.component, category),
                    fault.host,
                )
        for host in job.hosts:
            if self.hosts[host].driver == NEW_DRIVER:
                category = "gpu.gsp_timeout" if rng.random() < 0.6 else "cuda.launch_failure"
                driver = next(f for f in self.faults if f.kind == "driver")
                offer(
                    now + self._exp(30 * HOUR),
                    ("fault", "driver", driver.component, category),
                    host,
                )
        if first is not None:
            ts, cause, host = first
            job.end_ns, job.cause, job.root_host = ts, cause, host
            job.root_gpu = rng.randrange(8)

    def _kill(self, job: Job, cause: tuple[str, ...], host: str, gpu: int) -> None:
        """An outside fault ends a running job now (unless something ended it before)."""
        if self.now >= job.end_ns:
            return
        job.version += 1
        job.end_ns = self.now + int(self.rng.uniform(1, 20) * S)
        job.cause, job.root_host, job.root_gpu = cause, host, gpu
        job.driver = self.hosts[host].driver
        self._at(job.end_ns, "end", (job.ident, job.version))

    def _on_end(self, data: tuple[str, int]) -> None:
        ident, version = data
        job = self.jobs.get(ident)
        if job is None or job.version != version:
            return
        del self.jobs[ident]
        for host in job.hosts:
            self.hosts[host].busy = None
        if job.cause[0] == "fault":
            self._anomaly(job.cause[1], job.cause[2])
            if job.cause[3] == "gpu.gsp_timeout":  # the driver's GSP timeout, as the kernel logs it
                assert job.root_host is not None
                self._agent_line(job.root_host, "xid119", gpu=job.root_gpu)
        self.finished.append(job)
        telling = job.cause[0] != "ok"
        serials = {h: self.hosts[h].serials for h in job.hosts}
        report = job_report(self.catalog, job, serials)
        self.out.append(Delivery(self.now, "report", report, job.hosts[0], telling))
        for host in job.hosts:
            if self.hosts[host].drained:
                self._at(self.now + 4 * HOUR, "diagnostics", host)
        self._start_pending()

    def _anomaly(self, kind: str, component: str) -> None:
        for fault in self.faults:
            if fault.key == (kind, component) and fault.first_anomaly_ns is None:
                fault.first_anomaly_ns = self.now

    # -- faults ----------------------------------------------------------------------------
    def _running_on(self, host: str) -> Job | None:
        ident = self.hosts[host].busy
        return self.jobs.get(ident) if ident else None

    def _on_xid(self, fault: Fault) -> None:
        if not fault.active(self.now):
            return
        host, g = fault.host, fault.gpu or 0
        assert host is not None
        xid = self.rng.choices(("xid48", "xid94", "xid79", "xid63"), weights=(40, 25, 20, 15))[0]
        self._agent_line(host, xid, gpu=g)
        self._anomaly(fault.kind, fault.component)
        job = self._running_on(host)
        if job is not None and xid != "xid63":
            category = "gpu.fallen_off_bus" if xid == "xid79" else "gpu.ecc_uncorrectable"
            self._kill(job, ("fault", "gpu", fault.component, category, xid), host, g)
        self._at(self.now + self._exp(20 * HOUR), "xid", fault)

    def _on_edac(self, fault: Fault) -> None:
        if not fault.active(self.now):
            return
        assert fault.host is not None
        self._agent_line(fault.host, "edac")
        self._anomaly(fault.kind, fault.component)
        self._at(self.now + self._exp(14 * HOUR), "edac", fault)

    def _on_flap(self, fault: Fault) -> None:
        if not fault.active(self.now):
            return
        behind = [h for h in self.hosts.values() if h.switch == fault.component]
        self._anomaly(fault.kind, fault.component)
        for host in behind:
            if self.rng.random() < 0.5:
                self._agent_ib_warning(host.name)
            job = self._running_on(host.name)
            if job is not None and self.rng.random() < 0.6:
                self._kill(
                    job,
                    ("fault", "switch", fault.component, "net.ib_error"),
                    host.name,
                    self.rng.randrange(8),
                )
        self._at(self.now + self._exp(8 * HOUR), "flap", fault)

    def _on_rollout(self, host: str) -> None:
        driver = next(f for f in self.faults if f.kind == "driver")
        if driver.active(self.now):
            self.hosts[host].driver = NEW_DRIVER

    def _on_noise(self, kind: str) -> None:
        host = self.rng.choice(sorted(self.hosts))
        if kind == "ib_warning":
            self._agent_ib_warning(host)
        elif kind == "edac_ce":
            self._agent_line(host, "edac")
        elif kind == "link_down_warning":
            self._agent_line(host, "mlx_link_down")
        elif kind == "row_remap_pending":
            self._agent_line(host, "xid63", gpu=self.rng.randrange(8))
        elif kind == "link_flap_kill":  # a cable reseated by accident: one flap, one job
            self._agent_line(host, "mlx_link_down")
            job = self._running_on(host)
            if job is not None:
                self._kill(job, ("software", "net.ib_error"), host, self.rng.randrange(8))

    # -- the site's response ---------------------------------------------------------------
    def act(self, kind: str, component: str, hosts: tuple[str, ...]) -> None:
        """What a site does about an incident: drain a host (then diagnostics, repair),
        have the fabric team look at a switch, roll a driver back."""
        if kind in ("host", "gpu"):
            host = component if kind == "host" else self._host_of_serial(component)
            if host is None or host not in self.hosts or self.hosts[host].drained:
                return
            faulty = any(f.active(self.now) and f.host == host for f in self.faults)
            self.hosts[host].drained = True
            self.drains.append((self.now, host, faulty))
            if self.hosts[host].busy is None:
                self._at(self.now + 4 * HOUR, "diagnostics", host)
        elif kind == "switch":
            self._at(self.now + 6 * HOUR, "fabric_check", component)
        elif kind == "driver":
            self._at(self.now + 12 * HOUR, "rollback", component)

    def _host_of_serial(self, serial: str) -> str | None:
        for host in self.hosts.values():
            if serial in host.serials:
                return host.name
        return serial.split("/")[0] if "/" in serial else None

    def _on_diagnostics(self, host: str) -> None:
        record = self.hosts[host]
        if not record.drained or record.busy is not None:
            return
        broken = [f for f in self.faults if f.active(self.now) and f.host == host]
        if broken and self.rng.random() < 0.9:  # found: repair takes a day, then it passes
            for fault in broken:
                fault.fixed_ns = self.now + DAY
            self._at(self.now + DAY, "returned", host)
            return
        self._at(self.now, "returned", host)

    def _on_returned(self, host: str) -> None:
        record = self.hosts[host]
        record.drained = False
        record.diagnostics_passed_ns = self.now
        self._start_pending()

    def _on_fabric_check(self, switch: str) -> None:
        for fault in self.faults:
            if fault.key == ("switch", switch) and fault.active(self.now):
                fault.fixed_ns = self.now

    def _on_rollback(self, component: str) -> None:
        for fault in self.faults:
            if fault.key == ("driver", component) and fault.active(self.now):
                fault.fixed_ns = self.now
                for host in self.hosts.values():
                    host.driver = OLD_DRIVER

    # -- what the agents send --------------------------------------------------------------
    def _agent_id(self, host: str) -> str:
        return f"{host}:4242:{START_NS:x}:{next(self._ids)}"

    def _agent_line(self, host: str, which: str, gpu: int | None = None) -> None:
        line, found = kmsg_evidence(self.catalog, host, which, self.now, gpu, self._agent_id(host))
        self._send_agent(host, found)
        if which.startswith("xid") and host in self.kmsg_hosts:
            job = self._running_on(host)
            if job is not None:  # `denpex run` on this host reads the kernel log too
                job.kmsg.append((self.now, host, line))

    def _agent_ib_warning(self, host: str) -> None:
        port = f"mlx5_{self.rng.randrange(8)}"
        self._send_agent(host, [ib_warning(host, self.now, port, self._agent_id(host))])

    def _send_agent(self, host: str, found: list[Evidence]) -> None:
        if found:
            self.out.append(Delivery(self.now, "logs", otlp_logs(found, self.now), host))
