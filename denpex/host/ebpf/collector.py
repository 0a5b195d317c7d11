"""The `ebpf` collector: loads the CO-RE programs of bpf/ once, feeds them the watched job
pids, and each poll drains their ring buffers and maps into events and detector evidence.
Never blocks (ring buffers are polled with timeout 0) and never fails as a whole: a program
that cannot load or attach is reported with its reason while the others keep running.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from denpex.core.collector import CollectContext, Observation
from denpex.core.events import Event, metric
from denpex.core.roots import Roots, read_text
from denpex.core.wire import Registration
from denpex.host.base import HostCollector
from denpex.host.ebpf import layouts, loader, signed
from denpex.host.ebpf.events import (
    METRICS_HELP,
    exit_event,
    hang_evidence,
    oom_observations,
    retransmit_evidence,
)
from denpex.host.ebpf.layouts import CollectiveCall, PagefaultCounts, SchedMax, SchedStats
from denpex.host.ebpf.targets import (
    cgroup_path_by_inode,
    descendants,
    is_under,
    mapped_libraries,
    missing_privileges,
    pids_in_cgroup,
)

log = logging.getLogger(__name__)

PROGRAMS = ("sched", "oom", "tcpretrans", "pagefault", "collective")
# index = the attach cookie collective.bpf.c records as `fn`
COLLECTIVE_FUNCTIONS = (
    "ncclAllReduce",
    "ncclBroadcast",
    "ncclReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclSend",
    "ncclRecv",
    "ncclGroupEnd",
    "cuStreamSynchronize",
    "cuCtxSynchronize",
)
_NS = 1e-9


def bpf_dir(options: Mapping[str, Any]) -> Path:
    """Where the objects are: $DENPEX_BPF_DIR, the `bpf_dir` option, or the package's."""
    chosen = os.environ.get("DENPEX_BPF_DIR") or options.get("bpf_dir")
    if chosen:
        return Path(chosen)
    return Path(str(resources.files("denpex.host").joinpath("bpf")))


class EbpfCollector(HostCollector):
    name = "ebpf"
    stability = "experimental"
    # the in-kernel aggregates are read every 15 s; an OOM victim wakes a poll at once
    default_interval_s = 15.0
    default_budget_s = 2.0
    metrics_help: ClassVar[Mapping[str, str]] = METRICS_HELP

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(roots, options)
        self.objects: dict[str, loader.BpfObject] = {}
        self.program_errors: dict[str, str] = {}  # program -> why it is not running
        self.load_seconds: dict[str, float] = {}
        self._loaded = False
        self._pending: list[Observation] = []
        self._watched: dict[int, Registration] = {}  # tgid -> its registration
        self._recent: dict[int, Registration] = {}  # tgids watched lately (exits, OOM)
        self._tcp_prev: dict[bytes, int] = {}
        self._libraries: dict[tuple[int, int], str] = {}  # (dev, ino) -> path or error
        self._exits: list[layouts.ProcessExit] = []  # filled by ring-buffer callbacks
        self._ooms: list[layouts.OomVictim] = []

    # -- availability and loading -------------------------------------------------------

    def _objects_dir(self) -> Path:
        return bpf_dir(self.options)

    def enabled_programs(self) -> list[str]:
        return [p for p in self.options.get("programs", PROGRAMS) if p in PROGRAMS]

    def available(self) -> tuple[bool, str]:
        folder = self._objects_dir()
        built = [p for p in self.enabled_programs() if (folder / f"{p}.bpf.o").is_file()]
        problems = []
        if not built:
            problems.append(
                f"eBPF objects not built (no *.bpf.o in {folder}): run `python bpf/build.py` "
                "(needs clang, bpftool and kernel BTF) or set DENPEX_BPF_DIR"
            )
        try:
            loader.libbpf()
        except OSError as exc:
            problems.append(f"libbpf.so.1 cannot be loaded ({exc}): install libbpf1")
        btf = self.roots.sys("kernel", "btf", "vmlinux")
        if not btf.exists():
            problems.append(f"no kernel BTF at {btf}: the kernel needs CONFIG_DEBUG_INFO_BTF")
        privileges = missing_privileges(read_text(self.roots.proc("self", "status")), os.geteuid())
        if privileges:
            problems.append(privileges)
        if problems:
            return False, "; ".join(problems) + " (falling back to procfs/kmsg collectors)"
        try:
            trust = signed.trust_for(folder, self.options.get("release_key"))
        except signed.UnsignedObject as exc:
            return False, f"{exc} (falling back to procfs/kmsg collectors)"
        absent = sorted(set(self.enabled_programs()) - set(built))
        note = f" (not built: {', '.join(absent)})" if absent else ""
        return True, f"eBPF programs {', '.join(built)} from {folder}{note}, {trust.describe}"

    def load(self) -> None:
        """Opens, loads and attaches every enabled program once; failures are recorded."""
        if self._loaded:
            return
        self._loaded = True
        folder = self._objects_dir()
        try:
            trust = signed.trust_for(folder, self.options.get("release_key"))
        except signed.UnsignedObject as exc:
            for program in self.enabled_programs():
                self.program_errors[program] = str(exc)
            log.warning("no eBPF program loaded: %s", exc)
            return
        for program in self.enabled_programs():
            started = time.perf_counter()
            path = folder / f"{program}.bpf.o"
            try:
                if not path.is_file():
                    raise loader.BpfError(f"{path} not built")
                obj = loader.BpfObject(path, data=signed.verified_bytes(path, trust))
                try:
                    self._attach(program, obj)
                except Exception:
                    obj.close()
                    raise
            except (loader.BpfError, OSError, signed.UnsignedObject) as exc:
                self.program_errors[program] = str(exc)
                log.warning("eBPF program %s not running: %s", program, exc)
                continue
            self.objects[program] = obj
            self.load_seconds[program] = time.perf_counter() - started

    def _attach(self, program: str, obj: loader.BpfObject) -> None:
        if program == "sched":
            obj.attach_all()
            obj.ring_buffer("exits", self._on_exit)
        elif program == "oom":
            obj.attach_all()
            obj.ring_buffer("victims", self._on_oom)
        elif program != "collective":  # uprobes attach per library as libraries appear
            obj.attach_all()

    def close(self) -> None:
        self.stop_watching()
        for obj in self.objects.values():
            obj.close()
        self.objects.clear()

    def _on_exit(self, data: bytes) -> None:
        self._exits.append(layouts.decode_exit(data))

    def _on_oom(self, data: bytes) -> None:
        self._ooms.append(layouts.decode_oom(data))

    # -- one poll -----------------------------------------------------------------------

    def collect(self, ctx: CollectContext) -> list[Observation]:
        out: list[Observation] = []
        first = not self._loaded
        self.load()
        if first:
            out += self._program_states(ctx)
            oom = self.objects.get("oom")
            if oom is not None and oom._rings:  # an OOM victim asks for a poll at once
                self.wake_when_readable(oom._rings[0].epoll_fd())
        self._exits, self._ooms = [], []
        self._update_watched(ctx)
        for program, obj in self.objects.items():
            try:
                for ring in obj._rings:
                    ring.poll(0)
                reader = getattr(self, f"_collect_{program}", None)  # oom: ring buffer only
                if reader is not None:
                    out += reader(ctx, obj)
            except (loader.BpfError, OSError, ValueError) as exc:
                log.warning("eBPF program %s: poll failed: %s", program, exc)
        for ex in self._exits:
            job = self._job_fields(ex.tgid)
            out.append(exit_event(ex, ctx.host, self._wall_ns(ctx, ex.mono_ns), job))
        for victim in self._ooms:
            cgroup = self._victim_cgroup(victim)
            job = self._job_fields(victim.tgid, cgroup)
            ts_ns = self._wall_ns(ctx, victim.mono_ns)
            out += oom_observations(victim, ctx.host, ts_ns, cgroup, job)
        self.drained()
        return out

    def _program_states(self, ctx: CollectContext) -> list[Observation]:
        events: list[Observation] = []
        for program in self.enabled_programs():
            error = self.program_errors.get(program)
            source = f"ebpf.{_SOURCE.get(program, program)}"
            attached = metric(
                "ebpf_program_attached",
                0.0 if error else 1.0,
                source=source,
                labels={"program": program},
                host=ctx.host,
                ts_ns=ctx.now_ns,
            )
            events.append(attached)
            if error:
                body = f"eBPF program {program} is not running on this host: {error}"
                events.append(
                    Event(
                        body=body,
                        ts_ns=ctx.now_ns,
                        host=ctx.host,
                        source=source,
                        kind="state",
                        attrs={"program": program, "state": "failed", "reason": error},
                    )
                )
            else:
                events.append(
                    metric(
                        "ebpf_program_load_seconds",
                        self.load_seconds[program],
                        source=source,
                        labels={"program": program},
                        host=ctx.host,
                        ts_ns=ctx.now_ns,
                    )
                )
        return events

    def _update_watched(self, ctx: CollectContext) -> None:
        by_pid = {r.pid: r for r in ctx.jobs}
        watched = {pid: by_pid[root] for pid, root in descendants(self.roots, by_pid).items()}
        for reg in ctx.jobs:
            if reg.cgroup:
                for pid in pids_in_cgroup(self.roots, reg.cgroup):
                    watched.setdefault(pid, reg)
        added, removed = set(watched) - set(self._watched), set(self._watched) - set(watched)
        one = ctypes.c_uint8(1)
        for program in ("sched", "pagefault"):
            obj = self.objects.get(program)
            if obj is None:
                continue
            watched_map = obj.map("watched")
            for tgid in added:
                watched_map.update(ctypes.c_uint32(tgid), one)
            for tgid in removed:
                watched_map.delete(ctypes.c_uint32(tgid))
                for name in ("stats", "maxima") if program == "sched" else ("faults",):
                    obj.map(name).delete(ctypes.c_uint32(tgid))
        self._recent.update(watched)
        if len(self._recent) > 4 * max(len(watched), 1024):
            self._recent = dict(watched)
        self._watched = watched

    def _job_fields(self, pid: int | None, cgroup: str | None = None) -> dict[str, Any]:
        reg = self._recent.get(pid) if pid is not None else None
        if reg is None and cgroup:
            reg = next(
                (r for r in self._recent.values() if r.cgroup and is_under(cgroup, r.cgroup)), None
            )
        return {"job": reg.job, "rank": reg.rank, "tenant": reg.tenant} if reg else {}

    def _metric(
        self, ctx: CollectContext, name: str, value: float, source: str, **kw: Any
    ) -> Event:
        pid = kw.pop("pid", None)
        labels = kw.pop("labels", {})
        if pid is not None:
            labels = {"pid": str(pid), **labels}
        event = metric(
            name, value, source=source, labels=labels, host=ctx.host, ts_ns=ctx.now_ns, **kw
        )
        event.pid = pid
        job = self._job_fields(pid)
        event.job, event.rank, event.tenant = job.get("job"), job.get("rank"), job.get("tenant")
        return event

    # -- per program ----------------------------------------------------------------------

    def _collect_sched(self, ctx: CollectContext, obj: loader.BpfObject) -> list[Observation]:
        out: list[Observation] = []
        stats_map, max_map = obj.map("stats"), obj.map("maxima")
        for tgid in sorted(self._watched):
            key, stats, peak = ctypes.c_uint32(tgid), SchedStats(), SchedMax()
            if not stats_map.lookup(key, stats):
                continue
            if not max_map.lookup_and_delete(key, peak):
                peak = SchedMax()
            src = "ebpf.sched"
            out += [
                self._metric(ctx, "ebpf_runqueue_latency_seconds_total", stats.runq_ns_sum * _NS, src, pid=tgid, counter=True),
                self._metric(ctx, "ebpf_runqueue_waits_total", stats.runq_count, src, pid=tgid, counter=True),
                self._metric(ctx, "ebpf_runqueue_latency_max_seconds", peak.runq_ns_max * _NS, src, pid=tgid),
                self._metric(ctx, "ebpf_offcpu_seconds_total", stats.offcpu_ns_sum * _NS, src, pid=tgid, counter=True),
                self._metric(ctx, "ebpf_offcpu_switches_total", stats.offcpu_count, src, pid=tgid, counter=True),
                self._metric(ctx, "ebpf_offcpu_max_seconds", peak.offcpu_ns_max * _NS, src, pid=tgid),
            ]  # fmt: skip
        return out

    def _collect_pagefault(self, ctx: CollectContext, obj: loader.BpfObject) -> list[Observation]:
        out: list[Observation] = []
        faults = obj.map("faults")
        for tgid in sorted(self._watched):
            counts = PagefaultCounts()
            if faults.lookup(ctypes.c_uint32(tgid), counts):
                out.append(
                    self._metric(
                        ctx,
                        "ebpf_user_page_faults_total",
                        counts.user_faults,
                        "ebpf.pagefault",
                        pid=tgid,
                        counter=True,
                    )
                )
        return out

    def _collect_tcpretrans(self, ctx: CollectContext, obj: loader.BpfObject) -> list[Observation]:
        flows = obj.map("flows").items(layouts.TcpFlowKey, layouts.TcpFlowStats)
        current = {bytes(key): (key, value) for key, value in flows}
        deltas = []
        for raw, (key, value) in current.items():
            delta = value.retransmits - self._tcp_prev.get(raw, 0)
            if delta > 0:
                deltas.append((delta, key, value))
        self._tcp_prev = {raw: value.retransmits for raw, (_, value) in current.items()}
        deltas.sort(key=lambda d: -d[0])
        threshold = int(self.options.get("tcp_retransmits_per_poll", 50))
        out: list[Observation] = []
        for delta, key, value in deltas[: int(self.options.get("tcp_top_flows", 20))]:
            flow = layouts.decode_flow(key)
            labels = {
                "saddr": flow.saddr,
                "daddr": flow.daddr,
                "sport": str(flow.sport),
                "dport": str(flow.dport),
                "family": flow.family,
                "state": layouts.tcp_state_name(value.state),
            }
            event = self._metric(
                ctx, "ebpf_tcp_retransmits_total", value.retransmits, "ebpf.tcp",
                labels=labels, counter=True,
            )  # fmt: skip
            out.append(event)
            if delta >= threshold:
                out.append(retransmit_evidence(event, flow, labels, delta))
        return out

    def _collect_collective(self, ctx: CollectContext, obj: loader.BpfObject) -> list[Observation]:
        self._attach_libraries(obj)
        inflight = obj.map("inflight")
        now_mono = time.monotonic_ns()
        oldest: dict[int, CollectiveCall] = {}
        for key, call in inflight.items(ctypes.c_uint32, CollectiveCall):
            tid = key.value
            if not self.roots.proc(call.tgid, "task", tid).exists():
                inflight.delete(key)  # the thread died inside the call: not a hang
                continue
            if call.tgid not in oldest or call.start_ns < oldest[call.tgid].start_ns:
                oldest[call.tgid] = call
        hang_s = float(self.options.get("collective_hang_s", 300))
        out: list[Observation] = []
        for tgid in sorted(set(oldest) | set(self._watched)):
            oldest_call = oldest.get(tgid)
            age = max(now_mono - oldest_call.start_ns, 0) * _NS if oldest_call else 0.0
            fn = _function_name(oldest_call.fn) if oldest_call else ""
            labels = {"function": fn} if oldest_call else {}
            event = self._metric(
                ctx, "ebpf_oldest_collective_age_seconds", age, "ebpf.collective",
                pid=tgid, labels=labels,
            )  # fmt: skip
            out.append(event)
            if oldest_call and age >= hang_s:
                if not self.edges.first(("hang", tgid, oldest_call.start_ns)):
                    continue
                out.append(hang_evidence(event, tgid, fn, age, hang_s))
        return out

    def _attach_libraries(self, obj: loader.BpfObject) -> None:
        paths = {str(p): None for p in self.options.get("collective_libraries") or ()}
        for tgid in self._watched:
            maps = read_text(self.roots.proc(tgid, "maps")) or ""
            for lib in mapped_libraries(maps):  # through the process's root: containers
                paths.setdefault(str(self.roots.proc(tgid, "root")) + lib, None)
        for path in paths:
            try:
                st = os.stat(path)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in self._libraries:
                continue
            attached, errors = [], []
            for cookie, fn in enumerate(COLLECTIVE_FUNCTIONS):
                try:
                    obj.attach_uprobe("on_call_enter", path, fn, retprobe=False, cookie=cookie)
                    obj.attach_uprobe("on_call_exit", path, fn, retprobe=True, cookie=cookie)
                    attached.append(fn)
                except loader.BpfError as exc:
                    errors.append(str(exc))
            result = f"attached {','.join(attached)}" if attached else "; ".join(errors[:1])
            self._libraries[(st.st_dev, st.st_ino)] = f"{path}: {result}"
            log.info("eBPF collective uprobes on %s", self._libraries[(st.st_dev, st.st_ino)])

    # -- ring-buffer records --------------------------------------------------------------

    def _victim_cgroup(self, victim: layouts.OomVictim) -> str | None:
        cgroup = cgroup_path_by_inode(self.roots.cgroup("memory"), victim.memcg_ino)
        for hierarchy in ("unified", ""):
            if cgroup is None:
                cgroup = cgroup_path_by_inode(self.roots.cgroup(hierarchy), victim.cgroup2_ino)
        return cgroup

    def _wall_ns(self, ctx: CollectContext, mono_ns: int) -> int:
        return ctx.now_ns - max(time.monotonic_ns() - mono_ns, 0)


_SOURCE = {"tcpretrans": "tcp"}


def _function_name(index: int) -> str:
    return COLLECTIVE_FUNCTIONS[index] if 0 <= index < len(COLLECTIVE_FUNCTIONS) else str(index)
