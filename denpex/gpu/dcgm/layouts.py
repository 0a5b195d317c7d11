"""ctypes mirrors of the DCGM structs and constants denpex uses, from DCGM's public headers
(dcgm_structs.h, dcgm_fields.h, v3.2 to v4.6). Where a struct changed with DCGM 4 both
versions are here: DCGM 3 accepts only dcgmHealthResponse_v4 (64 incidents), DCGM 4 only
dcgmHealthResponse_v5 (1024 incidents); the diagnostic structs of DCGM 3.1 are still
accepted by DCGM 4 (DcgmApi.cpp helperActionManager).

Data only: never calls the library. A struct's version is sizeof(struct) | (ver << 24), so a
field out of place makes the library answer DCGM_ST_VER_MISMATCH instead of misreading memory.
"""

from __future__ import annotations

import ctypes

DCGM_MAX_NUM_DEVICES = 32
DCGM_MAX_STR_LENGTH = 256
DCGM_MAX_BLOB_LENGTH = 4096
DCGM_GROUP_MAX_ENTITIES = 64  # DCGM_GROUP_MAX_ENTITIES_V1
DCGM_GROUP_MAX_ENTITIES_V2 = 1024  # DCGM 4
DCGM_HEALTH_WATCH_MAX_INCIDENTS = DCGM_GROUP_MAX_ENTITIES
DCGM_HEALTH_WATCH_MAX_INCIDENTS_V2 = DCGM_GROUP_MAX_ENTITIES_V2
DCGM_MAX_ENTITIES_LISTED = 1024  # room for dcgmGetEntityGroupEntities' answer
DCGM_PER_GPU_TEST_COUNT_V8 = 13
LEVEL_ONE_MAX_RESULTS = 16
DCGM_MAX_TEST_NAMES, DCGM_MAX_TEST_NAMES_LEN = 20, 50
DCGM_MAX_TEST_PARMS, DCGM_MAX_TEST_PARMS_LEN = 100, 100
DCGM_GPU_LIST_LEN, DCGM_PATH_LEN = 50, 128
DCGM_MAX_CONFIG_FILE_LEN, DCGM_THROTTLE_MASK_LEN = 10000, 50
# dcgm_field_entity_group_t (DCGM_FE_CONNECTX exists since DCGM 4.1)
DCGM_FE_GPU, DCGM_FE_SWITCH, DCGM_FE_CONNECTX = 1, 3, 9
ENTITY_KINDS = {1: "gpu", 2: "vgpu", 3: "switch", 4: "gpu_i", 5: "gpu_ci", 6: "link", 7: "cpu",
                8: "cpu_core", 9: "connectx"}  # fmt: skip
FIELD_TYPE_DOUBLE, FIELD_TYPE_INT64, FIELD_TYPE_STRING = ord("d"), ord("i"), ord("s")

# dcgmReturn_t → (name, meaning)
RETURN_CODES: dict[int, tuple[str, str]] = {
    0: ("DCGM_ST_OK", "success"),
    -1: ("DCGM_ST_BADPARAM", "a bad parameter was passed"),
    -3: ("DCGM_ST_GENERIC_ERROR", "generic, unspecified error"),
    -4: ("DCGM_ST_MEMORY", "out of memory"),
    -5: ("DCGM_ST_NOT_CONFIGURED", "setting not configured"),
    -6: ("DCGM_ST_NOT_SUPPORTED", "feature not supported"),
    -7: ("DCGM_ST_INIT_ERROR", "DCGM init error"),
    -8: ("DCGM_ST_NVML_ERROR", "NVML returned an error"),
    -9: ("DCGM_ST_PENDING", "object is pending something else"),
    -10: ("DCGM_ST_UNINITIALIZED", "object is in an undefined state"),
    -11: ("DCGM_ST_TIMEOUT", "the operation timed out"),
    -12: ("DCGM_ST_VER_MISMATCH", "struct version not understood by this DCGM"),
    -13: ("DCGM_ST_UNKNOWN_FIELD", "unknown field id"),
    -14: ("DCGM_ST_NO_DATA", "no data available"),
    -15: ("DCGM_ST_STALE_DATA", "data is stale"),
    -16: ("DCGM_ST_NOT_WATCHED", "field is not watched"),
    -17: ("DCGM_ST_NO_PERMISSION", "no permission"),
    -18: ("DCGM_ST_GPU_IS_LOST", "GPU is no longer reachable"),
    -19: ("DCGM_ST_RESET_REQUIRED", "GPU requires a reset"),
    -20: ("DCGM_ST_FUNCTION_NOT_FOUND", "function not found"),
    -21: ("DCGM_ST_CONNECTION_NOT_VALID", "connection to the host engine is not valid"),
    -22: ("DCGM_ST_GPU_NOT_SUPPORTED", "GPU not supported by DCGM"),
    -23: ("DCGM_ST_GROUP_INCOMPATIBLE", "GPUs of the group are incompatible"),
    -24: ("DCGM_ST_MAX_LIMIT", "max limit reached"),
    -25: ("DCGM_ST_LIBRARY_NOT_FOUND", "a DCGM library could not be found"),
    -29: ("DCGM_ST_REQUIRES_ROOT", "needs a host engine running as root"),
    -30: ("DCGM_ST_NVVS_ERROR", "the diagnostic ran and reported an error"),
    -31: ("DCGM_ST_INSUFFICIENT_SIZE", "an argument is too small"),
    -32: ("DCGM_ST_FIELD_UNSUPPORTED_BY_API", "field not supported by this API"),
    -33: ("DCGM_ST_MODULE_NOT_LOADED", "the DCGM module is not loaded"),
    -34: ("DCGM_ST_IN_USE", "resource in use"),
    -35: ("DCGM_ST_GROUP_IS_EMPTY", "the group is empty"),
    -36: ("DCGM_ST_PROFILING_NOT_SUPPORTED", "profiling not supported on this GPU"),
    -37: ("DCGM_ST_PROFILING_LIBRARY_ERROR", "profiling library error"),
    -38: ("DCGM_ST_PROFILING_MULTI_PASS", "profiling fields need several passes"),
    -39: ("DCGM_ST_DIAG_ALREADY_RUNNING", "a diagnostic is already running"),
    -40: ("DCGM_ST_DIAG_BAD_JSON", "the diagnostic returned unparsable JSON"),
    -41: ("DCGM_ST_DIAG_BAD_LAUNCH", "the diagnostic could not be launched"),
    -43: ("DCGM_ST_DIAG_THRESHOLD_EXCEEDED", "a field value exceeded its threshold"),
    -44: ("DCGM_ST_INSUFFICIENT_DRIVER_VERSION", "driver too old for this API"),
    -45: ("DCGM_ST_INSTANCE_NOT_FOUND", "GPU instance not found"),
    -46: ("DCGM_ST_COMPUTE_INSTANCE_NOT_FOUND", "compute instance not found"),
    -47: ("DCGM_ST_CHILD_NOT_KILLED", "could not kill a child process"),
    -48: ("DCGM_ST_3RD_PARTY_LIBRARY_ERROR", "third-party library error"),
    -49: ("DCGM_ST_INSUFFICIENT_RESOURCES", "not enough resources"),
    -50: ("DCGM_ST_PLUGIN_EXCEPTION", "a diagnostic plugin threw"),
    -51: ("DCGM_ST_NVVS_ISOLATE_ERROR", "the diagnostic asks to isolate the GPU"),
    -52: ("DCGM_ST_NVVS_BINARY_NOT_FOUND", "nvvs binary not found"),
    -53: ("DCGM_ST_NVVS_KILLED", "nvvs was killed by a signal"),
    -54: ("DCGM_ST_PAUSED", "the host engine is paused"),
    -55: ("DCGM_ST_ALREADY_INITIALIZED", "already initialised"),
    -56: ("DCGM_ST_NVML_NOT_LOADED", "NVML is not loaded"),
    -57: ("DCGM_ST_NVML_DRIVER_TIMEOUT", "an NVML driver timeout was detected"),
}

# dcgmHealthSystems_t bits
HEALTH_SYSTEMS: dict[str, int] = {
    "pcie": 0x1,
    "nvlink": 0x2,
    "pmu": 0x4,
    "mcu": 0x8,
    "mem": 0x10,
    "sm": 0x20,
    "inforom": 0x40,
    "thermal": 0x80,
    "power": 0x100,
    "driver": 0x200,
    "nvswitch_nonfatal": 0x400,
    "nvswitch_fatal": 0x800,
    "connectx": 0x1000,  # DCGM 4.5.3 and later (older ones ignore the bit)
}
# the systems DCGM evaluates only for entities other than GPUs (DcgmHealthWatch.cpp)
SWITCH_SYSTEMS = ("nvswitch_nonfatal", "nvswitch_fatal")
CONNECTX_SYSTEMS = ("connectx",)
HEALTH_SYSTEM_NAMES = {bit: name for name, bit in HEALTH_SYSTEMS.items()}
HEALTH_RESULT_NAMES = {0: "pass", 10: "warn", 20: "fail"}
DIAG_RESULT_NAMES = {0: "pass", 1: "skip", 2: "warn", 3: "fail", 4: "not_run"}
# dcgmPerGpuTestIndices_t (DCGM 3.1+); 10-13 are unused slots
PER_GPU_TEST_NAMES = {
    0: "memory",
    1: "diagnostic",
    2: "pcie",
    3: "sm_stress",
    4: "targeted_stress",
    5: "targeted_power",
    6: "memory_bandwidth",
    7: "memtest",
    8: "pulse_test",
    9: "eud",
}
# dcgmSoftwareTest_t: level-one (software) tests
LEVEL_ONE_TEST_NAMES = {
    0: "software.denylist",
    1: "software.nvml_library",
    2: "software.cuda_main_library",
    3: "software.cuda_runtime_library",
    4: "software.permissions",
    5: "software.persistence_mode",
    6: "software.environment",
    7: "software.page_retirement",
    8: "software.graphics_processes",
    9: "software.inforom",
}

# DCGM's sentinels (blank, not found, not supported, no permission) start at these values
BLANK_INT64 = 0x7FFFFFFFFFFFFFF0
BLANK_FP64 = 140737488355328.0


def is_blank_text(value: str) -> bool:
    return value.startswith("<<<") and value.endswith(">>>")


def make_version(struct: type[ctypes.Structure], version: int) -> int:
    return ctypes.sizeof(struct) | (version << 24)


class ConnectV2Params(ctypes.Structure):
    """dcgmConnectV2Params_v2"""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("persistAfterDisconnect", ctypes.c_uint),
        ("timeoutMs", ctypes.c_uint),
        ("addressIsUnixSocket", ctypes.c_uint),
    ]


class _FieldValue(ctypes.Union):
    _fields_ = [
        ("i64", ctypes.c_int64),
        ("dbl", ctypes.c_double),
        ("str", ctypes.c_char * DCGM_MAX_STR_LENGTH),
        ("blob", ctypes.c_char * DCGM_MAX_BLOB_LENGTH),
    ]


class FieldValueV1(ctypes.Structure):
    """dcgmFieldValue_v1 (ts in microseconds since 1970)"""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("fieldId", ctypes.c_ushort),
        ("fieldType", ctypes.c_ushort),
        ("status", ctypes.c_int),
        ("ts", ctypes.c_int64),
        ("value", _FieldValue),
    ]


class DiagErrorDetail(ctypes.Structure):
    """dcgmDiagErrorDetail_t"""

    _fields_ = [("msg", ctypes.c_char * 1024), ("code", ctypes.c_uint)]


class GroupEntityPair(ctypes.Structure):
    """dcgmGroupEntityPair_t"""

    _fields_ = [("entityGroupId", ctypes.c_uint), ("entityId", ctypes.c_uint)]


class IncidentInfo(ctypes.Structure):
    """dcgmIncidentInfo_t"""

    _fields_ = [
        ("system", ctypes.c_uint),
        ("health", ctypes.c_uint),
        ("error", DiagErrorDetail),
        ("entityInfo", GroupEntityPair),
    ]


class HealthResponseV4(ctypes.Structure):
    """dcgmHealthResponse_v4 (DCGM 2.0 to 3.x; DCGM 4 answers it DCGM_ST_VER_MISMATCH)"""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("overallHealth", ctypes.c_uint),
        ("incidentCount", ctypes.c_uint),
        ("incidents", IncidentInfo * DCGM_HEALTH_WATCH_MAX_INCIDENTS),
    ]


class HealthResponseV5(ctypes.Structure):
    """dcgmHealthResponse_v5 (DCGM 4.0 and later, the only version DCGM 4 accepts)"""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("overallHealth", ctypes.c_uint),
        ("incidentCount", ctypes.c_uint),
        ("incidents", IncidentInfo * DCGM_HEALTH_WATCH_MAX_INCIDENTS_V2),
    ]


class VersionInfoV2(ctypes.Structure):
    """dcgmVersionInfo_v2: `rawBuildInfoString` reads like version:4.6.0;arch:x86_64;..."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("rawBuildInfoString", ctypes.c_char * (DCGM_MAX_STR_LENGTH * 2)),
    ]


class DiagTestResultV2(ctypes.Structure):
    """dcgmDiagTestResult_v2"""

    _fields_ = [
        ("status", ctypes.c_uint),
        ("error", DiagErrorDetail),
        ("info", ctypes.c_char * 1024),
    ]


class DiagResponsePerGpuV4(ctypes.Structure):
    """dcgmDiagResponsePerGpu_v4"""

    _fields_ = [
        ("gpuId", ctypes.c_uint),
        ("hwDiagnosticReturn", ctypes.c_uint),
        ("results", DiagTestResultV2 * DCGM_PER_GPU_TEST_COUNT_V8),
    ]


class DiagResponseV8(ctypes.Structure):
    """dcgmDiagResponse_v8 (DCGM 3.1; DCGM 3.x and 4.x still fill it when asked for it)"""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("gpuCount", ctypes.c_uint),
        ("levelOneTestCount", ctypes.c_uint),
        ("levelOneResults", DiagTestResultV2 * LEVEL_ONE_MAX_RESULTS),
        ("perGpuResponses", DiagResponsePerGpuV4 * DCGM_MAX_NUM_DEVICES),
        ("systemError", DiagErrorDetail),
        ("_unused", ctypes.c_char * 1024),
    ]


class RunDiagV7(ctypes.Structure):
    """dcgmRunDiag_v7: `validate` is the level (1 short, 2 medium, 3 long, 4 extra long)"""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("flags", ctypes.c_uint),
        ("debugLevel", ctypes.c_uint),
        ("groupId", ctypes.c_void_p),
        ("validate", ctypes.c_uint),
        ("testNames", (ctypes.c_char * DCGM_MAX_TEST_NAMES_LEN) * DCGM_MAX_TEST_NAMES),
        ("testParms", (ctypes.c_char * DCGM_MAX_TEST_PARMS_LEN) * DCGM_MAX_TEST_PARMS),
        ("fakeGpuList", ctypes.c_char * DCGM_GPU_LIST_LEN),
        ("gpuList", ctypes.c_char * DCGM_GPU_LIST_LEN),
        ("debugLogFile", ctypes.c_char * DCGM_PATH_LEN),
        ("statsPath", ctypes.c_char * DCGM_PATH_LEN),
        ("configFileContents", ctypes.c_char * DCGM_MAX_CONFIG_FILE_LEN),
        ("throttleMask", ctypes.c_char * DCGM_THROTTLE_MASK_LEN),
        ("pluginPath", ctypes.c_char * DCGM_PATH_LEN),
        ("_unusedInt1", ctypes.c_uint),
        ("_unusedInt2", ctypes.c_uint),
        ("_unusedInt3", ctypes.c_uint),
        ("_unusedBuf", ctypes.c_char * DCGM_PATH_LEN),
        ("failCheckInterval", ctypes.c_uint),
    ]


CONNECT_PARAMS_VERSION2 = make_version(ConnectV2Params, 2)
FIELD_VALUE_VERSION1 = make_version(FieldValueV1, 1)
HEALTH_RESPONSE_VERSION4 = make_version(HealthResponseV4, 4)
HEALTH_RESPONSE_VERSION5 = make_version(HealthResponseV5, 5)
VERSION_INFO_VERSION2 = make_version(VersionInfoV2, 2)
DIAG_RESPONSE_VERSION8 = make_version(DiagResponseV8, 8)
RUN_DIAG_VERSION7 = make_version(RunDiagV7, 7)
