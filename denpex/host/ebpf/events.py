"""Pure builders from decoded eBPF records to events and detector evidence: no I/O, no
kernel, so the tests check them on hand-made records. Never guesses a job: the caller
passes the job fields it resolved.
"""

from __future__ import annotations

from typing import Any

from denpex.core.detectors import detector_evidence
from denpex.core.events import Event, Evidence
from denpex.host.ebpf.layouts import OomVictim, ProcessExit, TcpFlow

METRICS_HELP: dict[str, str] = {
    "ebpf_program_attached": "1 when the eBPF program (label program) is loaded and attached",
    "ebpf_program_load_seconds": "Time to open, load and attach the eBPF program",
    "ebpf_runqueue_latency_seconds_total": "Time the process's threads waited runnable "
    "on a run queue (wakeup or preemption to on-CPU)",
    "ebpf_runqueue_waits_total": "Run-queue waits counted in ebpf_runqueue_latency_seconds_total",
    "ebpf_runqueue_latency_max_seconds": "Longest single run-queue wait since the last poll",
    "ebpf_offcpu_seconds_total": "Time the process's threads spent off CPU (sleeping or "
    "waiting to run)",
    "ebpf_offcpu_switches_total": "Switches back onto a CPU counted in ebpf_offcpu_seconds_total",
    "ebpf_offcpu_max_seconds": "Longest single off-CPU interval since the last poll",
    "ebpf_user_page_faults_total": "User-space page faults of the process",
    "ebpf_tcp_retransmits_total": "TCP retransmits of the flow (flows with retransmits "
    "since the last poll, the busiest first)",
    "ebpf_oldest_collective_age_seconds": "Age of the oldest host-side NCCL or CUDA "
    "synchronisation call still in flight in the process (0 when none)",
}


def exit_event(ex: ProcessExit, host: str, ts_ns: int, job: dict[str, Any]) -> Event:
    """The state event of a watched process's exit, with its code or signal."""
    how = (
        f"exited with code {ex.exit_code}"
        if ex.exit_code is not None
        else f"was killed by signal {ex.signal}" + (" (core dumped)" if ex.core_dumped else "")
    )
    attrs: dict[str, Any] = {"comm": ex.comm, "ppid": ex.ppid, "status": ex.status}
    if ex.exit_code is not None:
        attrs["exit_code"] = ex.exit_code
    else:
        attrs["signal"] = ex.signal
        attrs["core_dumped"] = ex.core_dumped
    return Event(
        body=f"process {ex.tgid} ({ex.comm}) {how}",
        ts_ns=ts_ns,
        host=host,
        source="ebpf.sched",
        kind="state",
        pid=ex.tgid,
        attrs=attrs,
        **job,
    )


def oom_observations(
    victim: OomVictim, host: str, ts_ns: int, cgroup: str | None, job: dict[str, Any]
) -> list[Event | Evidence]:
    """The state event of an OOM-killer victim and its critical host.oom_killed evidence."""
    attrs: dict[str, Any] = {
        "comm": victim.comm,
        "uid": victim.uid,
        "rss_bytes": victim.rss_bytes,
        "anon_rss_bytes": victim.anon_rss_kb * 1024,
        "file_rss_bytes": victim.file_rss_kb * 1024,
        "shmem_rss_bytes": victim.shmem_rss_kb * 1024,
        "total_vm_bytes": victim.total_vm_kb * 1024,
        "oom_score_adj": victim.oom_score_adj,
    }
    if cgroup is not None:
        attrs["cgroup"] = cgroup
    event = Event(
        body="",
        ts_ns=ts_ns,
        host=host,
        source="ebpf.oom",
        kind="state",
        pid=victim.tgid,
        attrs=attrs,
        **job,
    )
    evidence = detector_evidence(
        event,
        "host.oom_killed.oom_victim",
        captures={
            "pid": str(victim.tgid),
            "comm": victim.comm,
            "rss_bytes": str(victim.rss_bytes),
            "cgroup": cgroup or "",
        },
        values={
            "rss_mib": victim.rss_bytes // 2**20,
            "in_cgroup": f" in cgroup {cgroup}" if cgroup else "",
        },
    )
    event.body = evidence.summary
    return [event, evidence]


def retransmit_evidence(
    event: Event, flow: TcpFlow, labels: dict[str, str], delta: int
) -> Evidence:
    """A flow retransmitted more than the threshold within one poll: the path between two
    hosts loses packets (a link going down, congestion drops, a dead peer)."""
    return detector_evidence(
        event,
        "net.socket_error.tcp_retransmits",
        captures={**labels, "retransmits": str(delta)},
        values={"flow": flow.name()},
    )


def hang_evidence(event: Event, tgid: int, function: str, age_s: float, limit_s: float) -> Evidence:
    """A host-side NCCL/CUDA call blocked past the limit: the rank waits on a peer, the
    fabric or the GPU. Which one is not visible here, hence run_diagnostics (stack dumps of
    every rank, the peers' kernel logs) rather than a blind restart."""
    return detector_evidence(
        event,
        "train.hang.collective_blocked",
        captures={"function": function, "age_s": f"{age_s:.0f}", "pid": str(tgid)},
        values={"limit_s": limit_s},
    )
