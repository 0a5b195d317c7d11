"""The DCGM collector (Layer 2): profiling fields NVML lacks, exported under dcgm-exporter's
names, types and labels (denpex/gpu/dcgm_fields.yaml); DCGM health-watch incidents as
evidence, for the GPUs and for the NVSwitches and ConnectX cards DCGM evaluates only as
entities of their own; and `run_diagnostics` for remediation.

Every DCGM call runs under a deadline on its own worker (fields apart from health checks): a
call that does not return is evidence and blinds only its part; a poll never waits on it twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from denpex.core.collector import CollectContext, Observation, settings
from denpex.core.deadline import BoundedCaller, DeadlineExceeded
from denpex.core.events import metric
from denpex.core.roots import Roots
from denpex.gpu.base import GpuCollector
from denpex.gpu.dcgm.api import (
    DcgmError,
    DcgmSession,
    DiagResult,
    DiagTest,
    Incident,
    load_library,
)
from denpex.gpu.dcgm.layouts import (
    CONNECTX_SYSTEMS,
    DCGM_FE_CONNECTX,
    DCGM_FE_GPU,
    DCGM_FE_SWITCH,
    HEALTH_SYSTEMS,
    SWITCH_SYSTEMS,
)
from denpex.gpu.dcgm_fields import dcgm_fields, exporter_labels, field_id, help_texts, is_counter
from denpex.gpu.nvml.xid import default_table

__all__ = ["DcgmCollector", "DiagResult", "DiagTest", "run_diagnostics"]

NOT_FOUND = "libdcgm.so not found (install datacenter-gpu-manager)"
# read with the metrics: they become dcgm-exporter's labels modelName, UUID, pci_bus_id and
# DCGM_FI_DRIVER_VERSION (`device` is nvidia<DCGM gpu id>, as dcgm-exporter writes it)
IDENTITY_FIELDS = (
    "DCGM_FI_DEV_NAME",
    "DCGM_FI_DEV_UUID",
    "DCGM_FI_DEV_PCI_BUSID",
    "DCGM_FI_DRIVER_VERSION",
)
IDENTITY_KEYS = {
    "DCGM_FI_DEV_NAME": "name",
    "DCGM_FI_DEV_UUID": "uuid",
    "DCGM_FI_DEV_PCI_BUSID": "pci_bus_id",
    "DCGM_FI_DRIVER_VERSION": "driver_version",
}
HEALTH_LEVEL = {"pass": 0, "warn": 1, "fail": 2}
# health watch system → its detector (the category is what the system watches)
HEALTH_DETECTORS = {
    "pcie": "host.pcie_error.dcgm_health_pcie",
    "nvlink": "gpu.nvlink.dcgm_health_nvlink",
    "nvswitch_nonfatal": "gpu.nvlink.dcgm_health_nvswitch_nonfatal",
    "nvswitch_fatal": "gpu.nvlink.dcgm_health_nvswitch_fatal",
    "mem": "gpu.ecc_uncorrectable.dcgm_health_mem",
    "sm": "gpu.ecc_uncorrectable.dcgm_health_sm",
    "inforom": "gpu.reset_required.dcgm_health_inforom",
    "thermal": "gpu.thermal.dcgm_health_thermal",
    "power": "gpu.thermal.dcgm_health_power",
    "pmu": "gpu.gsp_timeout.dcgm_health_pmu",
    "mcu": "gpu.gsp_timeout.dcgm_health_mcu",
    "driver": "gpu.driver_mismatch.dcgm_health_driver",
    "connectx": "net.link_down.dcgm_health_connectx",
}
# since DCGM 4.5 the driver watch reports the GPU recovery action with these codes
RECOVERY_DETECTOR = "gpu.reset_required.dcgm_recovery_action"
# connection lost: drop the session and connect again on the next poll
_RECONNECT_CODES = {-21, -10, -7}  # CONNECTION_NOT_VALID, UNINITIALIZED, INIT_ERROR

HELP = {
    **help_texts(),
    "dcgm_health_overall": "DCGM health-watch verdict of the watched entities: 0 pass, 1 warn, 2 fail",
}


class DcgmCollector(GpuCollector):
    name = "dcgm"
    stability = "experimental"
    default_interval_s = 10.0
    default_budget_s = 5.0
    metrics_help = HELP

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(roots, options)
        timeout = float(self.options.get("call_timeout_s", 2.0))
        # two workers: a stuck health check must not stop the field readings, nor the reverse
        self._fields = BoundedCaller("dcgm.fields", timeout)
        self._health = BoundedCaller("dcgm.health", timeout)
        self._session: DcgmSession | None = None
        self._opening: DcgmSession | None = None  # while setup runs (a hang names its call)
        self._group = 0  # the GPUs: field watches
        self._health_group = 0  # the GPUs, NVSwitches and ConnectX cards: health watches
        self._gpus: list[int] = []
        exported = {n for n, f in dcgm_fields().items() if f.type in ("gauge", "counter")}
        self._field_names = [n for n in self.options.get("fields", []) if n in exported]
        self._labels: dict[int, dict[str, str]] = {}
        self._errors: dict[str, str] = {}  # part (setup, fields, health) → why it is blind
        self._hang_reported: set[str] = set()
        self._incidents: dict[tuple[str, str, int], str] = {}  # (entity, system, code) → health

    def available(self) -> tuple[bool, str]:
        path = self.options.get("library_path")
        try:
            load_library(path)
        except OSError as exc:
            # the loader's own words only for a configured path: for the default names they
            # just repeat "No such file" three times
            return False, f"{NOT_FOUND} at {path}: {exc}" if path else NOT_FOUND
        address = self.options.get("address") or "an embedded host engine"
        return True, f"DCGM fields and health watches through {address}"

    def host_facts(self) -> Mapping[str, str]:
        """The driver version DCGM reports for the GPUs (DCGM_FI_DRIVER_VERSION)."""
        drivers = sorted({lab.get("driver_version", "") for lab in self._labels.values()} - {""})
        return {"driver": ",".join(drivers)} if drivers else {}

    def degraded(self) -> str | None:
        reasons = [
            f"{c.stuck_call} has not returned for {c.hung_for():.0f} s ({c.name} blind)"
            for c in (self._fields, self._health)
            if c.hung_for()
        ]
        reasons += self._errors.values()
        return "; ".join(reasons) or None

    def collect(self, ctx: CollectContext) -> list[Observation]:
        out: list[Observation] = []
        for caller in (self._fields, self._health):
            if caller.name in self._hang_reported and not caller.hung_for():
                self._hang_reported.discard(caller.name)  # recovered: a new hang is news again
        if self._session is None:
            setup_timeout = float(self.options.get("setup_timeout_s", 10.0))
            if self._bounded(ctx, out, "setup", self._fields, self._open, setup_timeout) is None:
                return out
        for part, caller, poll in (
            ("fields", self._fields, self._poll_fields),
            ("health", self._health, self._poll_health),
        ):
            out.extend(self._bounded(ctx, out, part, caller, partial(poll, ctx)) or [])
        return out

    def close(self) -> None:
        session, self._session = self._session, None
        if session is not None and not self._fields.hung_for():
            try:
                self._fields.call(session.close)
            except (DcgmError, DeadlineExceeded):
                pass  # the process is going away; DCGM frees the handle with it

    def _bounded(
        self,
        ctx: CollectContext,
        out: list[Observation],
        part: str,
        caller: BoundedCaller,
        fn: Callable[[], list[Observation]],
        timeout_s: float | None = None,
    ) -> list[Observation] | None:
        """fn's result, run on `caller`; a DCGM error or a deadline becomes state (and hang
        evidence in `out`), never an exception: None then."""
        try:
            result = caller.call(fn, timeout_s=timeout_s)
        except DeadlineExceeded as exc:
            if caller.name not in self._hang_reported:
                self._hang_reported.add(caller.name)
                out.append(self._hang_evidence(ctx, caller, str(exc)))
            return None
        except DcgmError as exc:
            self._errors[part] = f"DCGM {part}: {exc}"
            if exc.code in _RECONNECT_CODES:
                self._session = None
            return None
        except OSError as exc:
            self._errors[part] = f"{NOT_FOUND}: {exc}"
            return None
        self._errors.pop(part, None)
        return result

    def _open(self) -> list[Observation]:
        """Connect, group the GPUs, watch the fields and the health systems (worker thread)."""
        lib = load_library(self.options.get("library_path"))
        mode = str(self.options.get("operation_mode", "manual"))
        session = DcgmSession(lib, str(self.options.get("address") or ""), mode)
        self._opening = session
        try:
            gpus = session.gpu_ids()
            chosen = self.options.get("gpus")
            self._gpus = [g for g in gpus if chosen is None or g in chosen]
            self._group = session.create_group("denpex", None if chosen is None else self._gpus)
            names = [*IDENTITY_FIELDS, *self._field_names]
            session.watch_fields(
                self._group,
                "denpex",
                [field_id(n) for n in names],
                float(self.options.get("watch_interval_s", 10.0)),
                float(self.options.get("watch_keep_s", 60.0)),
            )
            others = _entities(session, DCGM_FE_SWITCH) + _entities(session, DCGM_FE_CONNECTX)
            self._health_group = session.create_group(
                "denpex-health", [], [(DCGM_FE_GPU, g) for g in self._gpus] + others
            )
            kinds = {kind for kind, _ in others}
            systems = 0
            for system in self.options.get("health", {}):
                if system in SWITCH_SYSTEMS and DCGM_FE_SWITCH not in kinds:
                    continue  # evaluated only for switch entities: none here
                if system in CONNECTX_SYSTEMS and DCGM_FE_CONNECTX not in kinds:
                    continue
                systems |= HEALTH_SYSTEMS.get(system, 0)
            session.health_set(self._health_group, systems)
        except BaseException:
            session.close()
            raise
        self._session = session
        self._errors.clear()
        return []

    def _poll_fields(self, ctx: CollectContext) -> list[Observation]:
        out: list[Observation] = []
        session = self._session
        if session is None:
            return out
        if self.options.get("operation_mode", "manual") == "manual" and not session.address:
            session.update_all_fields(wait=True)
        titles = default_table().titles
        for gpu in self._gpus:
            names = [*IDENTITY_FIELDS, *self._field_names]
            readings = session.latest_values(gpu, [field_id(n) for n in names])
            by_name = {n: r.value for n, r in zip(names, readings, strict=True)}
            labels = self._gpu_labels(gpu, by_name, ctx.host)
            for name in self._field_names:
                value = by_name[name]
                if not isinstance(value, float):
                    continue
                extra = {}
                if name == "DCGM_FI_DEV_XID_ERRORS":  # dcgm-exporter's two labels of the Xid
                    code = int(value)
                    extra = {"err_code": str(code), "err_msg": titles.get(code, "Unknown Error")}
                out.append(
                    metric(name, value, source="dcgm", counter=is_counter(name),
                           labels={**labels, **extra}, host=ctx.host, ts_ns=ctx.now_ns)
                )  # fmt: skip
        return out

    def _gpu_labels(self, gpu: int, values: Mapping[str, Any], host: str) -> dict[str, str]:
        """dcgm-exporter's labels; identity values are cached once DCGM has reported them."""
        cached = self._labels.get(gpu)
        if cached is None or not cached.get("uuid"):
            cached = {key: str(values.get(name) or "") for name, key in IDENTITY_KEYS.items()}
            self._labels[gpu] = cached
        return exporter_labels(gpu, cached, host)

    def _poll_health(self, ctx: CollectContext) -> list[Observation]:
        session = self._session
        if session is None:
            return []
        report = session.health_check(self._health_group)
        out: list[Observation] = []
        out.append(
            metric("dcgm_health_overall", HEALTH_LEVEL.get(report.overall, 0), source="dcgm",
                   labels={"Hostname": ctx.host}, host=ctx.host, ts_ns=ctx.now_ns)
        )  # fmt: skip
        seen: dict[tuple[str, str, int], str] = {}
        for incident in report.incidents:
            key = (incident.entity, incident.system, incident.code)
            seen[key] = incident.health
            before = self._incidents.get(key)
            # an incident is news when it appears or worsens, not on every poll it persists
            if before is None or HEALTH_LEVEL.get(incident.health, 0) > HEALTH_LEVEL.get(before, 0):
                evidence = self._incident_evidence(ctx, incident)
                if evidence is not None:
                    out.append(evidence)
        self._incidents = seen
        return out

    def _incident_evidence(self, ctx: CollectContext, incident: Incident) -> Observation | None:
        actions = (self.options.get("health") or {}).get(incident.system)
        severity = (self.options.get("health_severity") or {}).get(incident.health)
        detector_id = HEALTH_DETECTORS.get(incident.system)
        if not actions or not severity or detector_id is None:
            return None  # a system nobody mapped, or a pass
        recovery = (self.options.get("recovery_codes") or {}).get(incident.code)
        if incident.system == "driver" and recovery:
            # DCGM 4.5+: the driver watch reports the recovery action NVML asks for
            detector_id, actions = RECOVERY_DETECTOR, {incident.health: recovery}
        labels = self._labels.get(incident.gpu, {}) if incident.gpu is not None else {}
        attrs = {
            "system": incident.system,
            "health": incident.health,
            "code": incident.code,
            "entity": incident.entity,
            "gpu": "" if incident.gpu is None else str(incident.gpu),
            "UUID": labels.get("uuid", ""),
        }
        what = f"GPU {incident.gpu}" if incident.gpu is not None else incident.entity
        return self.finding(
            ctx,
            detector_id,
            kind="signal",
            attrs=attrs,
            captures={k: str(v) for k, v in attrs.items()},
            values={"what": what, "message": incident.message},
            # the health result (warn or fail) decides, through the settings' health tables
            severity=severity,
            action=actions.get(incident.health, "run_diagnostics"),
        )

    def _hang_evidence(self, ctx: CollectContext, caller: BoundedCaller, why: str) -> Observation:
        session = self._session or self._opening
        call = (session.in_call if session else "") or caller.stuck_call or "a DCGM call"
        attrs = {"call": call, "worker": caller.name}
        return self.finding(
            ctx,
            "gpu.gsp_timeout.dcgm_call_hung",
            kind="signal",
            attrs=attrs,
            captures={k: str(v) for k, v in attrs.items()},
            values={"why": why},
        )


def _entities(session: DcgmSession, entity_group: int) -> list[tuple[int, int]]:
    """Every entity of a kind DCGM lists here; none where this DCGM or node has none
    (no NVSwitch module, a DCGM older than ConnectX support: DCGM_ST_NOT_SUPPORTED)."""
    try:
        return [(entity_group, entity) for entity in session.entities(entity_group)]
    except DcgmError:
        return []


def run_diagnostics(
    level: int, *, deadline: float, options: Mapping[str, Any] | None = None
) -> DiagResult:
    """Run the DCGM diagnostic at `level` (1 short … 3 long, 4 extra long) on the configured
    GPUs and return its results; never raises for DCGM's own failures: verdict "error" or
    "timeout" (after `deadline` seconds, the diagnostic left running) says why not."""
    if level not in (1, 2, 3, 4):
        raise ValueError(f"DCGM diagnostic level must be 1-4, not {level}")
    opts = {**settings("denpex.gpu:settings.yaml", "dcgm"), **(options or {})}
    try:
        lib = load_library(opts.get("library_path"))
    except OSError as exc:
        return DiagResult(level=level, verdict="error", error=f"{NOT_FOUND}: {exc}")

    def run() -> DiagResult:
        session = DcgmSession(lib, str(opts.get("address") or ""), "manual")
        try:
            chosen = opts.get("gpus")
            gpus = None if chosen is None else [int(g) for g in chosen]
            return session.run_diagnostic(session.create_group("denpex-diag", gpus), level)
        finally:
            session.close()

    try:
        return BoundedCaller("dcgm.diag", deadline).call(run)
    except DeadlineExceeded as exc:
        return DiagResult(level=level, verdict="timeout", error=str(exc))
    except DcgmError as exc:
        return DiagResult(level=level, verdict="error", error=str(exc))
