"""The fleet simulator's records (fleet_sim.py): its settings, the injected faults (the truth
the benchmark scores against), jobs, hosts and what is sent. Plain data."""

from __future__ import annotations

from dataclasses import dataclass, field

S = 1_000_000_000
GPU_BUSES = ("18", "2a", "3b", "4c", "5d", "9a", "ab", "bc")
HOUR = 3600 * S
DAY = 24 * HOUR
START_NS = 1_798_761_600 * S  # 2027-01-01T00:00:00Z: the simulated fleet's first instant
OLD_DRIVER, NEW_DRIVER = "535.161.08", "550.54.15"
IMAGES = ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io/nvidia/pytorch:24.07-py3", "site/llm:2.3")


@dataclass
class SimConfig:
    seed: int = 1
    hosts: int = 512
    hosts_per_switch: int = 16
    hosts_per_rack: int = 32
    days: float = 21.0
    jobs_per_day: float = 200.0
    xid_gpus: int = 4  # GPUs that Xid now and then
    flapping_switches: int = 2  # leaf switches with a flapping uplink
    bad_memory_hosts: int = 3  # hosts whose jobs die as "software"
    rollout_share: float = 0.3  # hosts that get the bad driver
    rollout_day: float = 8.0
    software_failure: float = 0.12  # share of jobs that fail from their own code or data
    kmsg_visible: float = 0.5  # share of hosts where `denpex run` can read the kernel log


@dataclass
class Fault:
    """One injected fault: what it is (the truth an incident must name) and when."""

    kind: str
    component: str
    host: str | None
    start_ns: int
    first_anomaly_ns: int | None = None
    fixed_ns: int | None = None
    gpu: int | None = None  # GPU index for a GPU fault

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.component)

    def active(self, now_ns: int) -> bool:
        return self.start_ns <= now_ns and (self.fixed_ns is None or now_ns < self.fixed_ns)


@dataclass
class Job:
    ident: str
    name: str
    user: str
    image: str
    hosts: list[str]
    start_ns: int
    end_ns: int
    cause: tuple[str, ...] = ("ok",)  # ("ok",), ("software", category), ("fault", kind, id, cat)
    root_host: str | None = None
    root_gpu: int = 0
    version: int = 0
    size: int = 1
    driver: str = OLD_DRIVER  # the root host's driver when the job started
    kmsg: list[tuple[int, str, str]] = field(default_factory=list)  # kernel lines `denpex run` read


@dataclass
class Delivery:
    """What one agent or one `denpex run` sends at `ts_ns`."""

    ts_ns: int
    kind: str  # "logs" (OTLP protobuf) | "report" (JSON)
    body: bytes
    host: str | None = None
    telling: bool = True  # a failed job or an agent's warning: worth a correlation pass


@dataclass
class HostRecord:
    name: str
    index: int
    switch: str
    rack: str
    driver: str = OLD_DRIVER
    busy: str | None = None  # job id
    drained: bool = False
    diagnostics_passed_ns: int | None = None
    serials: list[str] = field(default_factory=list)
