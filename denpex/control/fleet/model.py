"""The fleet's plain records: what the correlation rules read (FleetView) and what they and
the incident grouping return (IncidentCandidate, Incident, MergeResult).

Plain data with small look-ups only; never touches a store, a socket or the clock (callers
build a FleetView from whatever they hold and pass `now_ns`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# What an incident can blame. The first group are things a site drains or replaces, the
# topology kinds are shared hardware, the last group are shared dependencies (never a host).
HARDWARE_KINDS = ("host", "gpu")
TOPOLOGY_KINDS = ("switch", "rail", "pdu", "rack", "pool")
DEPENDENCY_KINDS = (
    "filesystem",
    "scheduler",
    "driver",
    "firmware",
    "image",
    "kernel",
    "dependency",
)
COMPONENT_KINDS = HARDWARE_KINDS + TOPOLOGY_KINDS + DEPENDENCY_KINDS

VERDICTS = ("suspect", "recovered")  # a candidate blames its component, or clears it
INCIDENT_STATES = ("open", "acknowledged", "resolved")


@dataclass(frozen=True, slots=True)
class GpuRef:
    """One GPU as a job or an agent names it: the host it sits in, its PCI address as the
    driver prints it ("0000:3b:00.0") and its board serial (NVML), which follows the board
    when it moves to another host."""

    host: str
    pci: str | None = None
    serial: str | None = None
    rank: int | None = None  # the job's rank on this GPU (JobOutcome.gpus only)


@dataclass(frozen=True, slots=True)
class EvidenceRecord:
    """One evidence item as the control plane stores it: an agent's host event (kernel log,
    NVML, DCGM, IB counters …) or one line of a job report's timeline."""

    id: str
    ts_ns: int | None
    host: str | None
    category: str
    severity: str  # info | warning | error | critical
    source: str  # kmsg, nvml, ib, log … (DESIGN §3)
    signature: str = ""
    rank: int | None = None
    gpu_pci: str | None = None
    gpu_serial: str | None = None
    job: str | None = None  # the job the agent attributed it to, when it could
    tenant: str | None = None
    body: str = ""


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """How one job ended, from its report (`denpex.diagnosis/v1` plus the job's placement).

    `category`, `root_host`, `root_rank`, `confidence`, `rule` and `evidence` are the
    report's `root_cause`; `root_gpu` is the GPU that cause names, when it names one (a PCI
    address in its evidence, or the GPU of its rank); `timeline` is the report's timeline,
    which re-diagnosis joins with the agents' host events. A job whose ranks ran under one
    wrapper each sends one report per rank: `reports.job_outcomes` makes them one."""

    tenant: str
    job: str
    hosts: tuple[str, ...]
    ended_ns: int
    status: str  # "failed" | "ok", the diagnosis status
    category: str = "unknown"
    root_host: str | None = None
    root_rank: int | None = None
    root_gpu: GpuRef | None = None
    confidence: float = 0.0
    rule: str = ""
    evidence: tuple[str, ...] = ()
    started_ns: int | None = None
    ranks: Mapping[int, str] = field(default_factory=dict)  # rank → host
    gpus: tuple[GpuRef, ...] = ()
    exit_code: int | None = None
    exit_signal: str | None = None
    timeline: tuple[EvidenceRecord, ...] = ()
    user: str | None = None
    name: str | None = None  # the workload's name: reruns of one workload share it
    labels: Mapping[str, str] = field(default_factory=dict)  # image, driver … as reported
    reports: int = 1  # how many reports it was assembled from (one per host or rank)

    @property
    def failed(self) -> bool:
        return self.status == "failed"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a host sits: the shared hardware its jobs depend on (site topology file or the
    agents' fabric snapshots). `rails` maps a GPU's PCI address to its rail in a
    rail-optimised fabric (the rail switch its NIC is cabled to, where the agent's
    neighbours say); `ports` each RDMA port ("mlx5_0/1") to the switch it is cabled to;
    `sources` each field set to where it came from (site topology, UFM, ibnetdiscover …)."""

    host: str
    rack: str | None = None
    switch: str | None = None  # the leaf switch its NICs connect to
    pdu: str | None = None
    pool: str | None = None
    rails: Mapping[str, str] = field(default_factory=dict)
    ports: Mapping[str, str] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)

    def components(self) -> list[tuple[str, str]]:
        """(kind, id) of every shared component this host depends on."""
        out = [
            (kind, value)
            for kind, value in (
                ("rack", self.rack),
                ("switch", self.switch),
                ("pdu", self.pdu),
                ("pool", self.pool),
            )
            if value
        ]
        out.extend(("rail", rail) for rail in sorted(set(self.rails.values())))
        return out


@dataclass(frozen=True, slots=True)
class HostState:
    """What is known of a host beyond its jobs: its last passing diagnostics (DCGM level 3 or
    the site's own), the clean jobs it ran since (None: count them from the view's jobs) and
    labels that name its shared dependencies (driver, image, kernel, filesystem …)."""

    host: str
    diagnostics_passed_ns: int | None = None
    clean_jobs_since: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class FleetView:
    """Recent fleet history, as much as `FleetConfig.lookback_s` asks for."""

    jobs: list[JobOutcome] = field(default_factory=list)
    host_events: list[EvidenceRecord] = field(default_factory=list)
    topology: Mapping[str, Placement] = field(default_factory=dict)  # host → placement
    hosts: Mapping[str, HostState] = field(default_factory=dict)  # host → state


@dataclass(frozen=True, slots=True)
class IncidentCandidate:
    """What one fleet rule concluded about one component, over the whole view.

    `component` is the host name, a GPU's id (`gpu_id`), the switch / rail / PDU / rack /
    pool id, or `key=value` of a shared dependency (`driver=550.54.15`). A `recovered`
    verdict says the component left suspicion. `action` is a §7 action for it. `score` is
    the rule's raw strength (e.g. -log10 of a p-value) that `confidence` calibrates."""

    rule: str
    kind: str
    component: str
    category: str
    confidence: float
    evidence: tuple[str, ...]
    jobs: tuple[str, ...]
    hosts: tuple[str, ...]
    first_ns: int
    last_ns: int
    explanation: str
    verdict: str = "suspect"
    action: str = "none"
    tenants: tuple[str, ...] = ()
    score: float = 0.0

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.component)


@dataclass(frozen=True, slots=True)
class Incident:
    """One incident as it is stored: one cause (kind, component), the rules that fired for
    it, the jobs and evidence attached. `id` is None until the store gives it one."""

    id: str | None
    kind: str
    component: str
    category: str
    confidence: float
    rules: tuple[str, ...]
    evidence: tuple[str, ...]
    jobs: tuple[str, ...]
    hosts: tuple[str, ...]
    first_ns: int
    last_ns: int
    explanation: str
    state: str = "open"
    action: str = "none"
    tenants: tuple[str, ...] = ()
    score: float = 0.0  # the strongest rule score behind `confidence`

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.component)


@dataclass(frozen=True, slots=True)
class IncidentUpdate:
    """An open incident that grew: its new state and exactly what was added to it."""

    incident: Incident
    added_evidence: tuple[str, ...]
    added_jobs: tuple[str, ...]
    rule: str  # the rule whose candidate grew it


@dataclass(frozen=True, slots=True)
class IncidentResolution:
    """An open incident whose component recovered: resolve it, citing the candidate."""

    incident: Incident
    rule: str
    evidence: tuple[str, ...]
    explanation: str


@dataclass(slots=True)
class MergeResult:
    """What `merge` asks the store to do; empty lists when nothing changed."""

    opened: list[Incident] = field(default_factory=list)
    updated: list[IncidentUpdate] = field(default_factory=list)
    resolved: list[IncidentResolution] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.opened or self.updated or self.resolved)


def gpu_id(gpu: GpuRef) -> str:
    """A GPU's component id: its serial when known (it follows the board), else host/PCI."""
    if gpu.serial:
        return gpu.serial
    return f"{gpu.host}/{gpu.pci or '?'}"
