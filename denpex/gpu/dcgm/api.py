"""A minimal ctypes binding of libdcgm (DCGM 3.x/4.x C API): connect, entities and groups,
field watches, health checks and diagnostics, with the struct layouts of DCGM's public
dcgm_structs.h mirrored in layouts.py. A struct whose accepted version changed with DCGM 4
(the health response) is picked by the loaded library's major version (dcgmVersionInfo).

Never raises past `DcgmError` (a return code, named) or OSError (no library); never hides a
blocking call: callers run every method under a deadline (`denpex.core.deadline`).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from denpex.gpu.dcgm.layouts import (
    BLANK_FP64,
    BLANK_INT64,
    CONNECT_PARAMS_VERSION2,
    DCGM_FE_GPU,
    DCGM_MAX_ENTITIES_LISTED,
    DCGM_MAX_NUM_DEVICES,
    DIAG_RESPONSE_VERSION8,
    DIAG_RESULT_NAMES,
    ENTITY_KINDS,
    FIELD_TYPE_DOUBLE,
    FIELD_TYPE_INT64,
    FIELD_TYPE_STRING,
    FIELD_VALUE_VERSION1,
    HEALTH_RESPONSE_VERSION4,
    HEALTH_RESPONSE_VERSION5,
    HEALTH_RESULT_NAMES,
    HEALTH_SYSTEM_NAMES,
    LEVEL_ONE_TEST_NAMES,
    PER_GPU_TEST_NAMES,
    RETURN_CODES,
    RUN_DIAG_VERSION7,
    VERSION_INFO_VERSION2,
    ConnectV2Params,
    DiagResponseV8,
    FieldValueV1,
    HealthResponseV4,
    HealthResponseV5,
    RunDiagV7,
    VersionInfoV2,
    is_blank_text,
)

LIBRARY_NAMES = ("libdcgm.so.4", "libdcgm.so.3", "libdcgm.so")
DCGM_ST_OK = 0
DCGM_ST_VER_MISMATCH = -12
DCGM_OPERATION_MODE = {"auto": 1, "manual": 2}
DCGM_GROUP_DEFAULT, DCGM_GROUP_EMPTY = 0, 1
# diagnostics that ran but found a problem still fill the response
_DIAG_RAN_CODES = {0, -30, -51}  # OK, NVVS_ERROR, NVVS_ISOLATE_ERROR

_u = ctypes.c_uint
_handle = ctypes.c_void_p  # dcgmHandle_t, dcgmGpuGrp_t, dcgmFieldGrp_t are uintptr_t
_SIGNATURES: dict[str, list[object]] = {
    "dcgmInit": [],
    "dcgmShutdown": [],
    "dcgmStartEmbedded": [ctypes.c_int, ctypes.POINTER(_handle)],
    "dcgmStopEmbedded": [_handle],
    "dcgmConnect_v2": [ctypes.c_char_p, ctypes.POINTER(ConnectV2Params), ctypes.POINTER(_handle)],
    "dcgmDisconnect": [_handle],
    "dcgmGetAllSupportedDevices": [_handle, ctypes.POINTER(_u), ctypes.POINTER(ctypes.c_int)],
    "dcgmGroupCreate": [_handle, ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_handle)],
    "dcgmGroupAddDevice": [_handle, _handle, _u],
    "dcgmGroupAddEntity": [_handle, _handle, _u, _u],
    "dcgmGetEntityGroupEntities": [
        _handle,
        _u,
        ctypes.POINTER(_u),
        ctypes.POINTER(ctypes.c_int),
        _u,
    ],
    "dcgmFieldGroupCreate": [
        _handle,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_ushort),
        ctypes.c_char_p,
        ctypes.POINTER(_handle),
    ],
    "dcgmWatchFields": [
        _handle,
        _handle,
        _handle,
        ctypes.c_longlong,
        ctypes.c_double,
        ctypes.c_int,
    ],
    "dcgmUpdateAllFields": [_handle, ctypes.c_int],
    "dcgmGetLatestValuesForFields": [
        _handle,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_ushort),
        _u,
        ctypes.POINTER(FieldValueV1),
    ],
    "dcgmHealthSet": [_handle, _handle, _u],
    "dcgmHealthCheck": [_handle, _handle, ctypes.c_void_p],  # v4 (DCGM 3) or v5 (DCGM 4)
    "dcgmActionValidate_v2": [_handle, ctypes.POINTER(RunDiagV7), ctypes.POINTER(DiagResponseV8)],
}
# entry points a DCGM may lack; the session copes without them
_OPTIONAL: dict[str, list[object]] = {"dcgmVersionInfo": [ctypes.POINTER(VersionInfoV2)]}
_init_lock = threading.Lock()
_init_count: dict[int, int] = {}  # id(CDLL) → sessions holding dcgmInit
_libraries: dict[str, ctypes.CDLL] = {}


class DcgmError(RuntimeError):
    """A DCGM call returned an error: `code` (negative int) and `name` (DCGM_ST_...)."""

    def __init__(self, call: str, code: int) -> None:
        self.call, self.code = call, code
        self.name, reason = RETURN_CODES.get(code, (f"DCGM_ST_{code}", "unknown return code"))
        super().__init__(f"{call} failed: {self.name} ({reason})")


def load_library(path: str | None = None) -> ctypes.CDLL:
    """libdcgm from `path`, else the first of LIBRARY_NAMES the loader finds (one CDLL per
    name, so every session of this process shares its dcgmInit); raises OSError naming what
    was tried."""
    errors = []
    for name in [path] if path else LIBRARY_NAMES:
        with _init_lock:
            if name in _libraries:
                return _libraries[name]
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
            continue
        missing = [fn for fn in _SIGNATURES if not hasattr(lib, fn)]
        if missing:
            raise OSError(f"{name} lacks {', '.join(missing)} (DCGM older than 3.0?)")
        for fn, argtypes in {**_SIGNATURES, **_OPTIONAL}.items():
            if not hasattr(lib, fn):
                continue
            func = getattr(lib, fn)
            func.restype = ctypes.c_int
            func.argtypes = argtypes
        with _init_lock:
            return _libraries.setdefault(name, lib)
    raise OSError("; ".join(errors))


def library_major(lib: ctypes.CDLL, name: str = "") -> int | None:
    """The major version of a loaded libdcgm: from dcgmVersionInfo ("version:4.6.0;..."),
    else from the soname it was loaded by (libdcgm.so.4), else None."""
    if hasattr(lib, "dcgmVersionInfo"):
        info = VersionInfoV2(version=VERSION_INFO_VERSION2)
        if lib.dcgmVersionInfo(ctypes.byref(info)) == DCGM_ST_OK:
            for pair in _text(info.rawBuildInfoString).split(";"):
                key, _, value = pair.partition(":")
                if key == "version" and value.split(".")[0].isdigit():
                    return int(value.split(".")[0])
    tail = name.rpartition(".so.")[2]
    return int(tail.split(".")[0]) if ".so." in name and tail.split(".")[0].isdigit() else None


@dataclass(frozen=True, slots=True)
class FieldReading:
    field_id: int
    value: float | str | None  # None: blank, not supported or no data yet
    ts_us: int
    status: int


@dataclass(frozen=True, slots=True)
class Incident:
    system: str  # pcie, nvlink, mem, thermal ... (DCGM_HEALTH_WATCH_* lower-case)
    health: str  # pass | warn | fail
    code: int  # dcgmError_t (DCGM_FR_*)
    message: str
    gpu: int | None  # None when the entity is not a GPU
    entity: str  # "gpu:1", "switch:0", "connectx:0" ...


@dataclass(frozen=True, slots=True)
class HealthReport:
    overall: str
    incidents: tuple[Incident, ...]


@dataclass(frozen=True, slots=True)
class DiagTest:
    name: str
    gpu: int | None  # None for a system-wide (level one, software) test
    result: str  # pass | skip | warn | fail | not_run
    code: int = 0
    message: str = ""
    info: str = ""


@dataclass(frozen=True, slots=True)
class DiagResult:
    """The outcome of a DCGM diagnostic: `verdict` is pass, warn, fail, or error (it could
    not run: `error` says why) or timeout (it did not finish before the deadline)."""

    level: int
    verdict: str
    tests: tuple[DiagTest, ...] = ()
    error: str = ""
    failed: tuple[DiagTest, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "failed", tuple(t for t in self.tests if t.result == "fail"))


class DcgmSession:
    """One handle to DCGM (an embedded host engine or a connection to nv-hostengine). Not
    thread-safe by itself: the collector serialises calls through its bounded callers."""

    def __init__(
        self, lib: ctypes.CDLL, address: str = "", mode: str = "manual", name: str = ""
    ) -> None:
        self.lib, self.address = lib, address
        self.handle = _handle()
        self.in_call = ""
        self.major = library_major(lib, name or getattr(lib, "_name", ""))
        with _init_lock:
            if _init_count.get(id(lib), 0) == 0:
                self._run("dcgmInit")
            _init_count[id(lib)] = _init_count.get(id(lib), 0) + 1
        try:
            if address:
                params = ConnectV2Params(version=CONNECT_PARAMS_VERSION2, timeoutMs=5000)
                params.addressIsUnixSocket = int(address.startswith("/"))
                self._run(
                    "dcgmConnect_v2",
                    address.encode(),
                    ctypes.byref(params),
                    ctypes.byref(self.handle),
                )
            else:
                self._run("dcgmStartEmbedded", DCGM_OPERATION_MODE[mode], ctypes.byref(self.handle))
        except BaseException:
            self._release_init()
            raise

    def _call(self, name: str, *args: object) -> int:
        """One library call; `in_call` names it while it runs (what a hang report says)."""
        self.in_call = name
        rc = int(getattr(self.lib, name)(*args))
        self.in_call = ""
        return rc

    def _run(self, name: str, *args: object) -> None:
        rc = self._call(name, *args)
        if rc != DCGM_ST_OK:
            raise DcgmError(name, rc)

    def _release_init(self) -> None:
        with _init_lock:
            _init_count[id(self.lib)] -= 1
            if _init_count[id(self.lib)] == 0:
                self._call("dcgmShutdown")

    def gpu_ids(self) -> list[int]:
        ids = (_u * DCGM_MAX_NUM_DEVICES)()
        count = ctypes.c_int()
        self._run("dcgmGetAllSupportedDevices", self.handle, ids, ctypes.byref(count))
        return list(ids[: max(0, min(count.value, DCGM_MAX_NUM_DEVICES))])

    def entities(self, entity_group: int) -> list[int]:
        """The ids of every entity of an entity group (DCGM_FE_SWITCH, DCGM_FE_CONNECTX ...);
        DcgmError when this DCGM cannot list the group (DCGM_ST_NOT_SUPPORTED)."""
        ids = (_u * DCGM_MAX_ENTITIES_LISTED)()
        count = ctypes.c_int(DCGM_MAX_ENTITIES_LISTED)
        self._run(
            "dcgmGetEntityGroupEntities", self.handle, entity_group, ids, ctypes.byref(count), 0
        )
        return list(ids[: max(0, min(count.value, DCGM_MAX_ENTITIES_LISTED))])

    def create_group(
        self,
        name: str,
        gpus: Sequence[int] | None = None,
        entities: Sequence[tuple[int, int]] = (),
    ) -> int:
        """DCGM_GROUP_DEFAULT (every GPU) when `gpus` is None, else a group of those GPUs;
        then the other `entities` ((entity group, id): switches, ConnectX cards) added."""
        group = _handle()
        kind = DCGM_GROUP_DEFAULT if gpus is None else DCGM_GROUP_EMPTY
        self._run("dcgmGroupCreate", self.handle, kind, name.encode(), ctypes.byref(group))
        for gpu in gpus or ():
            self._run("dcgmGroupAddDevice", self.handle, group, gpu)
        for entity_group, entity in entities:
            self._run("dcgmGroupAddEntity", self.handle, group, entity_group, entity)
        return group.value or 0

    def watch_fields(
        self, group: int, name: str, field_ids: Sequence[int], interval_s: float, keep_s: float
    ) -> int:
        ids = (ctypes.c_ushort * len(field_ids))(*field_ids)
        fgroup = _handle()
        self._run(
            "dcgmFieldGroupCreate",
            self.handle,
            len(field_ids),
            ids,
            name.encode(),
            ctypes.byref(fgroup),
        )
        self._run(
            "dcgmWatchFields", self.handle, group, fgroup, int(interval_s * 1e6), float(keep_s), 0
        )
        return fgroup.value or 0

    def update_all_fields(self, wait: bool = True) -> None:
        self._run("dcgmUpdateAllFields", self.handle, int(wait))

    def latest_values(self, gpu: int, field_ids: Sequence[int]) -> list[FieldReading]:
        ids = (ctypes.c_ushort * len(field_ids))(*field_ids)
        values = (FieldValueV1 * len(field_ids))()
        for value in values:
            value.version = FIELD_VALUE_VERSION1
        self._run("dcgmGetLatestValuesForFields", self.handle, gpu, ids, len(field_ids), values)
        return [_reading(v) for v in values]

    def health_set(self, group: int, systems: int) -> None:
        self._run("dcgmHealthSet", self.handle, group, systems)

    def health_check(self, group: int) -> HealthReport:
        """dcgmHealthCheck with the response version the loaded DCGM accepts: v5 from DCGM 4
        on, v4 before; a library whose version is unknown is asked v5, then v4."""
        response: HealthResponseV4 | HealthResponseV5
        if self.major is not None and self.major < 4:
            response = HealthResponseV4(version=HEALTH_RESPONSE_VERSION4)
            rc = self._call("dcgmHealthCheck", self.handle, group, ctypes.byref(response))
        else:
            response = HealthResponseV5(version=HEALTH_RESPONSE_VERSION5)
            rc = self._call("dcgmHealthCheck", self.handle, group, ctypes.byref(response))
            if rc == DCGM_ST_VER_MISMATCH and self.major is None:
                self.major = 3  # an older DCGM: remember, ask v4 from now on
                return self.health_check(group)
        if rc != DCGM_ST_OK:
            raise DcgmError("dcgmHealthCheck", rc)
        count = min(response.incidentCount, len(response.incidents))
        return HealthReport(
            overall=HEALTH_RESULT_NAMES.get(response.overallHealth, "unknown"),
            incidents=tuple(_incident(response.incidents[i]) for i in range(count)),
        )

    def run_diagnostic(self, group: int, level: int) -> DiagResult:
        """dcgmActionValidate_v2 at `level` (1 short … 4 extra long) on `group`."""
        request = RunDiagV7(version=RUN_DIAG_VERSION7, flags=1, groupId=group, validate=level)
        response = DiagResponseV8(version=DIAG_RESPONSE_VERSION8)
        rc = self._call(
            "dcgmActionValidate_v2", self.handle, ctypes.byref(request), ctypes.byref(response)
        )
        if rc not in _DIAG_RAN_CODES:
            raise DcgmError("dcgmActionValidate_v2", rc)
        return parse_diag_response(response, level)

    def close(self) -> None:
        if self.handle.value is not None:
            if self.address:
                self._call("dcgmDisconnect", self.handle)
            else:
                self._call("dcgmStopEmbedded", self.handle)
            self.handle = _handle()
            self._release_init()


def _text(raw: bytes) -> str:
    return raw.decode(errors="replace").strip()


def _reading(value: FieldValueV1) -> FieldReading:
    parsed: float | str | None = None
    if value.status == DCGM_ST_OK:
        if value.fieldType == FIELD_TYPE_DOUBLE and value.value.dbl < BLANK_FP64:
            parsed = value.value.dbl
        elif value.fieldType == FIELD_TYPE_INT64 and value.value.i64 < BLANK_INT64:
            parsed = float(value.value.i64)
        elif value.fieldType == FIELD_TYPE_STRING:
            text = _text(value.value.str)
            parsed = None if is_blank_text(text) else text
    return FieldReading(value.fieldId, parsed, value.ts, value.status)


def _incident(info: object) -> Incident:
    entity_group, entity_id = info.entityInfo.entityGroupId, info.entityInfo.entityId  # type: ignore[attr-defined]
    kinds = ENTITY_KINDS
    return Incident(
        system=HEALTH_SYSTEM_NAMES.get(info.system, f"system_{info.system}"),  # type: ignore[attr-defined]
        health=HEALTH_RESULT_NAMES.get(info.health, "unknown"),  # type: ignore[attr-defined]
        code=info.error.code,  # type: ignore[attr-defined]
        message=_text(info.error.msg),  # type: ignore[attr-defined]
        gpu=entity_id if entity_group == DCGM_FE_GPU else None,
        entity=f"{kinds.get(entity_group, str(entity_group))}:{entity_id}",
    )


def parse_diag_response(response: DiagResponseV8, level: int) -> DiagResult:
    """Pure: the tests a dcgmDiagResponse_v8 reports (tests not run are left out)."""
    tests: list[DiagTest] = []
    for index in range(min(response.levelOneTestCount, len(response.levelOneResults))):
        result = response.levelOneResults[index]
        name = LEVEL_ONE_TEST_NAMES.get(index, f"software_{index}")
        tests.append(_diag_test(name, None, result))
    for slot in range(min(response.gpuCount, len(response.perGpuResponses))):
        per_gpu = response.perGpuResponses[slot]
        for index, result in enumerate(per_gpu.results):
            if index in PER_GPU_TEST_NAMES:
                tests.append(_diag_test(PER_GPU_TEST_NAMES[index], per_gpu.gpuId, result))
    tests = [t for t in tests if t.result != "not_run"]
    system_error = _text(response.systemError.msg)
    results = {t.result for t in tests}
    verdict = (
        "fail" if "fail" in results or system_error else "warn" if "warn" in results else "pass"
    )
    return DiagResult(level=level, verdict=verdict, tests=tuple(tests), error=system_error)


def _diag_test(name: str, gpu: int | None, result: object) -> DiagTest:
    return DiagTest(
        name=name,
        gpu=gpu,
        result=DIAG_RESULT_NAMES.get(result.status, "not_run"),  # type: ignore[attr-defined]
        code=result.error.code,  # type: ignore[attr-defined]
        message=_text(result.error.msg),  # type: ignore[attr-defined]
        info=_text(result.info),  # type: ignore[attr-defined]
    )
