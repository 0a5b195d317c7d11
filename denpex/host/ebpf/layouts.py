"""ctypes mirrors of the structs in bpf/*.h and pure decoders from their bytes to values.

A test checks every mirror against the sizes and offsets the build wrote (layouts.json);
nothing here touches the kernel, so the decoders are tested without BPF.
"""

from __future__ import annotations

import ctypes
import ipaddress
from dataclasses import dataclass

COMM_LEN = 16
AF_INET, AF_INET6 = 2, 10
# include/net/tcp_states.h
TCP_STATES = (
    "",
    "ESTABLISHED",
    "SYN_SENT",
    "SYN_RECV",
    "FIN_WAIT1",
    "FIN_WAIT2",
    "TIME_WAIT",
    "CLOSE",
    "CLOSE_WAIT",
    "LAST_ACK",
    "LISTEN",
    "CLOSING",
    "NEW_SYN_RECV",
    "BOUND_INACTIVE",
)


class SchedStats(ctypes.Structure):
    _fields_ = [
        ("runq_ns_sum", ctypes.c_uint64),
        ("runq_count", ctypes.c_uint64),
        ("offcpu_ns_sum", ctypes.c_uint64),
        ("offcpu_count", ctypes.c_uint64),
    ]


class SchedMax(ctypes.Structure):
    _fields_ = [("runq_ns_max", ctypes.c_uint64), ("offcpu_ns_max", ctypes.c_uint64)]


class SchedExitEvent(ctypes.Structure):
    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("pid", ctypes.c_uint32),
        ("tgid", ctypes.c_uint32),
        ("ppid", ctypes.c_uint32),
        ("exit_code", ctypes.c_int32),
        ("comm", ctypes.c_char * COMM_LEN),
    ]


class OomVictimEvent(ctypes.Structure):
    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("memcg_ino", ctypes.c_uint64),
        ("cgroup2_ino", ctypes.c_uint64),
        ("total_vm_kb", ctypes.c_uint64),
        ("anon_rss_kb", ctypes.c_uint64),
        ("file_rss_kb", ctypes.c_uint64),
        ("shmem_rss_kb", ctypes.c_uint64),
        ("pid", ctypes.c_uint32),
        ("tgid", ctypes.c_uint32),
        ("uid", ctypes.c_uint32),
        ("oom_score_adj", ctypes.c_int32),
        ("comm", ctypes.c_char * COMM_LEN),
    ]


class TcpFlowKey(ctypes.Structure):
    _fields_ = [
        ("saddr", ctypes.c_uint8 * 16),
        ("daddr", ctypes.c_uint8 * 16),
        ("sport", ctypes.c_uint16),
        ("dport", ctypes.c_uint16),
        ("family", ctypes.c_uint16),
        ("pad", ctypes.c_uint16),
    ]


class TcpFlowStats(ctypes.Structure):
    _fields_ = [
        ("retransmits", ctypes.c_uint64),
        ("last_ns", ctypes.c_uint64),
        ("state", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class PagefaultCounts(ctypes.Structure):
    _fields_ = [("user_faults", ctypes.c_uint64)]


class CollectiveCall(ctypes.Structure):
    _fields_ = [
        ("start_ns", ctypes.c_uint64),
        ("tgid", ctypes.c_uint32),
        ("fn", ctypes.c_uint32),
        ("depth", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


# C struct name (bpf/*.h) -> its mirror; the layout test walks this table
MIRRORS: dict[str, type[ctypes.Structure]] = {
    "sched_stats": SchedStats,
    "sched_max": SchedMax,
    "sched_exit_event": SchedExitEvent,
    "oom_victim_event": OomVictimEvent,
    "tcp_flow_key": TcpFlowKey,
    "tcp_flow_stats": TcpFlowStats,
    "pagefault_counts": PagefaultCounts,
    "collective_call": CollectiveCall,
}


@dataclass(frozen=True, slots=True)
class ProcessExit:
    pid: int
    tgid: int
    ppid: int
    status: int  # as wait(2) reports it
    comm: str
    mono_ns: int

    @property
    def exit_code(self) -> int | None:
        """The code passed to exit(), or None when a signal ended the process."""
        return (self.status >> 8) & 0xFF if self.status & 0x7F == 0 else None

    @property
    def signal(self) -> int | None:
        return self.status & 0x7F or None

    @property
    def core_dumped(self) -> bool:
        return bool(self.status & 0x80)


@dataclass(frozen=True, slots=True)
class OomVictim:
    pid: int
    tgid: int
    uid: int
    comm: str
    memcg_ino: int
    cgroup2_ino: int
    total_vm_kb: int
    anon_rss_kb: int
    file_rss_kb: int
    shmem_rss_kb: int
    oom_score_adj: int
    mono_ns: int

    @property
    def rss_bytes(self) -> int:
        return (self.anon_rss_kb + self.file_rss_kb + self.shmem_rss_kb) * 1024


@dataclass(frozen=True, slots=True)
class TcpFlow:
    saddr: str
    daddr: str
    sport: int
    dport: int
    family: str  # "ipv4" | "ipv6"

    def name(self) -> str:
        if self.family == "ipv6":
            return f"[{self.saddr}]:{self.sport}->[{self.daddr}]:{self.dport}"
        return f"{self.saddr}:{self.sport}->{self.daddr}:{self.dport}"


def _comm(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def _record(struct: type[ctypes.Structure], data: bytes) -> ctypes.Structure:
    if len(data) < ctypes.sizeof(struct):
        raise ValueError(f"{struct.__name__}: {len(data)} bytes < {ctypes.sizeof(struct)}")
    return struct.from_buffer_copy(data[: ctypes.sizeof(struct)])


def decode_exit(data: bytes) -> ProcessExit:
    """A sched_exit_event record from the ring buffer."""
    rec = _record(SchedExitEvent, data)
    return ProcessExit(
        rec.pid, rec.tgid, rec.ppid, rec.exit_code & 0xFFFF, _comm(rec.comm), rec.ts_ns
    )


def decode_oom(data: bytes) -> OomVictim:
    """An oom_victim_event record from the ring buffer."""
    rec = _record(OomVictimEvent, data)
    return OomVictim(
        pid=rec.pid,
        tgid=rec.tgid,
        uid=rec.uid,
        comm=_comm(rec.comm),
        memcg_ino=rec.memcg_ino,
        cgroup2_ino=rec.cgroup2_ino,
        total_vm_kb=rec.total_vm_kb,
        anon_rss_kb=rec.anon_rss_kb,
        file_rss_kb=rec.file_rss_kb,
        shmem_rss_kb=rec.shmem_rss_kb,
        oom_score_adj=rec.oom_score_adj,
        mono_ns=rec.ts_ns,
    )


def decode_flow(key: TcpFlowKey) -> TcpFlow:
    """A tcp_flow_key as addresses and ports (IPv4 uses the first 4 address bytes)."""
    if key.family == AF_INET6:
        src, dst = bytes(key.saddr), bytes(key.daddr)
        return TcpFlow(
            str(ipaddress.IPv6Address(src)),
            str(ipaddress.IPv6Address(dst)),
            key.sport,
            key.dport,
            "ipv6",
        )
    return TcpFlow(
        str(ipaddress.IPv4Address(bytes(key.saddr[:4]))),
        str(ipaddress.IPv4Address(bytes(key.daddr[:4]))),
        key.sport,
        key.dport,
        "ipv4",
    )


def tcp_state_name(state: int) -> str:
    return TCP_STATES[state] if 0 < state < len(TCP_STATES) else str(state)
