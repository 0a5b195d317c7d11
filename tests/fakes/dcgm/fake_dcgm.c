/* A fake libdcgm for tests: the few DCGM entry points denpex calls, answering from a scenario
 * file named by $DENPEX_FAKE_DCGM_SCENARIO, re-read on every call so a test can change it
 * between polls. Structs are written from DCGM's public dcgm_structs.h; every versioned struct
 * is checked, so a ctypes mirror out of shape gets DCGM_ST_VER_MISMATCH as from real DCGM.
 * Built once per DCGM major version (-DFAKE_DCGM_MAJOR=3 or 4), it refuses what that version
 * refuses: DCGM 3 takes only dcgmHealthResponse_v4 and knows no ConnectX entities, DCGM 4
 * takes only dcgmHealthResponse_v5 (DcgmApi.cpp tsapiEngineHealthCheck). A health check
 * reports incidents only for entities in the group, and the NVSwitch systems only for switch
 * entities, the ConnectX system only for ConnectX ones (DcgmHealthWatch.cpp).
 *
 * Scenario lines (anything else is ignored):
 *   gpus N | switches N | connectx N            how many entities of each kind (2, 0, 0)
 *   value GPU FIELD d|i|s VALUE                 latest value of a field
 *   incident SYSTEM_BIT HEALTH ENTITY CODE MSG  a health incident (HEALTH 10 warn, 20 fail);
 *                                               ENTITY is a GPU id, or gpu:N, switch:N, cx:N
 *   diag GPU|sw INDEX RESULT CODE MSG           a diagnostic result (RESULT 0 pass .. 3 fail)
 *   hang FUNCTION                               FUNCTION blocks while this line is present
 *   fail FUNCTION RC                            FUNCTION returns RC
 * Build: gcc -shared -fPIC -DFAKE_DCGM_MAJOR=4 -o libdcgm.so.4 fake_dcgm.c
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef FAKE_DCGM_MAJOR
#define FAKE_DCGM_MAJOR 4
#endif
#define MAKE_DCGM_VERSION(t, v) (unsigned int)(sizeof(t) | ((unsigned long)(v) << 24U))
#define MAX_DEVICES 32
#define MAX_INCIDENTS 64      /* DCGM_HEALTH_WATCH_MAX_INCIDENTS (DCGM 3) */
#define MAX_INCIDENTS_V2 1024 /* DCGM_HEALTH_WATCH_MAX_INCIDENTS_V2 (DCGM 4) */
#define MAX_ENTITIES 256
#define MAX_GROUPS 64
#define FE_GPU 1
#define FE_SWITCH 3
#define FE_CONNECTX 9
#define SYSTEM_NVSWITCH (0x400U | 0x800U)
#define SYSTEM_CONNECTX 0x1000U
#define PER_GPU_TESTS 13
#define LEVEL_ONE_MAX 16
#define ST_OK 0
#define ST_BADPARAM -1
#define ST_NOT_SUPPORTED -6
#define ST_UNINITIALIZED -10
#define ST_VER_MISMATCH -12
#define ST_NO_DATA -14
#define ST_NOT_WATCHED -16
#define ST_CONNECTION_NOT_VALID -21
#define ST_INSUFFICIENT_SIZE -31
#define MAX_LINES 256

typedef uintptr_t dcgmHandle_t;
typedef uintptr_t dcgmGpuGrp_t;
typedef uintptr_t dcgmFieldGrp_t;

typedef struct {
    unsigned int version, persistAfterDisconnect, timeoutMs, addressIsUnixSocket;
} dcgmConnectV2Params_v2;

typedef struct {
    unsigned int version;
    unsigned short fieldId;
    unsigned short fieldType;
    int status;
    int64_t ts;
    union {
        int64_t i64;
        double dbl;
        char str[256];
        char blob[4096];
    } value;
} dcgmFieldValue_v1;

typedef struct {
    char msg[1024];
    unsigned int code;
} dcgmDiagErrorDetail_t;

typedef struct {
    unsigned int entityGroupId, entityId;
} dcgmGroupEntityPair_t;

typedef struct {
    unsigned int system, health;
    dcgmDiagErrorDetail_t error;
    dcgmGroupEntityPair_t entityInfo;
} dcgmIncidentInfo_t;

typedef struct {
    unsigned int version, overallHealth, incidentCount;
    dcgmIncidentInfo_t incidents[MAX_INCIDENTS];
} dcgmHealthResponse_v4;

typedef struct {
    unsigned int version, overallHealth, incidentCount;
    dcgmIncidentInfo_t incidents[MAX_INCIDENTS_V2];
} dcgmHealthResponse_v5;

typedef struct {
    unsigned int version;
    char rawBuildInfoString[512];
} dcgmVersionInfo_v2;

/* a group's entities and the health systems set on it */
struct group {
    int used;
    unsigned int systems;
    int count;
    dcgmGroupEntityPair_t entities[MAX_ENTITIES];
};

typedef struct {
    unsigned int status;
    dcgmDiagErrorDetail_t error;
    char info[1024];
} dcgmDiagTestResult_v2;

typedef struct {
    unsigned int gpuId, hwDiagnosticReturn;
    dcgmDiagTestResult_v2 results[PER_GPU_TESTS];
} dcgmDiagResponsePerGpu_v4;

typedef struct {
    unsigned int version, gpuCount, levelOneTestCount;
    dcgmDiagTestResult_v2 levelOneResults[LEVEL_ONE_MAX];
    dcgmDiagResponsePerGpu_v4 perGpuResponses[MAX_DEVICES];
    dcgmDiagErrorDetail_t systemError;
    char _unused[1024];
} dcgmDiagResponse_v8;

typedef struct {
    unsigned int version, flags, debugLevel;
    dcgmGpuGrp_t groupId;
    unsigned int validate;
    char testNames[20][50];
    char testParms[100][100];
    char fakeGpuList[50];
    char gpuList[50];
    char debugLogFile[128];
    char statsPath[128];
    char configFileContents[10000];
    char throttleMask[50];
    char pluginPath[128];
    unsigned int _unusedInt1, _unusedInt2, _unusedInt3;
    char _unusedBuf[128];
    unsigned int failCheckInterval;
} dcgmRunDiag_v7;

static int g_initialized, g_updates;
static dcgmHandle_t g_handle;
static uintptr_t g_next_group = 1;
static struct group g_groups[MAX_GROUPS];
static unsigned short g_watched[128];
static int g_watched_count;
static char g_lines[MAX_LINES][1200];
static int g_line_count;

static void load_scenario(void) {
    g_line_count = 0;
    const char *path = getenv("DENPEX_FAKE_DCGM_SCENARIO");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return;
    while (g_line_count < MAX_LINES && fgets(g_lines[g_line_count], sizeof g_lines[0], f)) {
        g_lines[g_line_count][strcspn(g_lines[g_line_count], "\n")] = 0;
        g_line_count++;
    }
    fclose(f);
}

/* The text after the first `skip` words of a line. */
static const char *rest_after(const char *line, int skip) {
    while (skip-- > 0) {
        while (*line && *line != ' ') line++;
        while (*line == ' ') line++;
    }
    return line;
}

static int scenario_has(const char *verb, const char *fn) {
    char want[200];
    snprintf(want, sizeof want, "%s %s", verb, fn);
    for (int i = 0; i < g_line_count; i++)
        if (strcmp(g_lines[i], want) == 0) return 1;
    return 0;
}

/* Every entry point starts here: hang while the scenario says so, fail when it says so. */
static int enter(const char *fn, int *rc) {
    load_scenario();
    for (int waited_ms = 0; scenario_has("hang", fn) && waited_ms < 30000; waited_ms += 20) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        load_scenario();
    }
    char prefix[200];
    snprintf(prefix, sizeof prefix, "fail %s ", fn);
    for (int i = 0; i < g_line_count; i++)
        if (strncmp(g_lines[i], prefix, strlen(prefix)) == 0) {
            *rc = atoi(g_lines[i] + strlen(prefix));
            return 1;
        }
    return 0;
}

static int count_of(const char *kind, int fallback) {
    char format[32];
    snprintf(format, sizeof format, "%s %%d", kind);
    for (int i = 0; i < g_line_count; i++) {
        int n;
        if (sscanf(g_lines[i], format, &n) == 1) return n < MAX_DEVICES ? n : MAX_DEVICES;
    }
    return fallback;
}

static int gpu_count(void) { return count_of("gpus", 2); }

/* How many entities of an entity group exist; -1 when this DCGM does not know the group. */
static int entity_count(unsigned int entity_group) {
    if (entity_group == FE_GPU) return gpu_count();
    if (entity_group == FE_SWITCH) return count_of("switches", 0);
    if (entity_group == FE_CONNECTX) return FAKE_DCGM_MAJOR >= 4 ? count_of("connectx", 0) : -1;
    return -1;
}

static void reset_groups(void) {
    memset(g_groups, 0, sizeof g_groups);
    g_next_group = 1;
}

static struct group *group_of(dcgmGpuGrp_t id) {
    return (id >= 1 && id < MAX_GROUPS && g_groups[id].used) ? &g_groups[id] : NULL;
}

static void group_add(struct group *g, unsigned int entity_group, unsigned int id) {
    for (int i = 0; i < g->count; i++)
        if (g->entities[i].entityGroupId == entity_group && g->entities[i].entityId == id) return;
    if (g->count < MAX_ENTITIES)
        g->entities[g->count++] = (dcgmGroupEntityPair_t){entity_group, id};
}

static int group_has(const struct group *g, unsigned int entity_group, unsigned int id) {
    for (int i = 0; i < g->count; i++)
        if (g->entities[i].entityGroupId == entity_group && g->entities[i].entityId == id) return 1;
    return 0;
}

#define ENTER(fn)                       \
    int forced_rc;                      \
    if (enter(fn, &forced_rc)) return forced_rc

int dcgmInit(void) {
    ENTER("dcgmInit");
    g_initialized = 1;
    return ST_OK;
}

int dcgmVersionInfo(dcgmVersionInfo_v2 *info) {
    ENTER("dcgmVersionInfo");
    if (!info) return ST_BADPARAM;
    if (info->version != MAKE_DCGM_VERSION(dcgmVersionInfo_v2, 2)) return ST_VER_MISMATCH;
    snprintf(info->rawBuildInfoString, sizeof info->rawBuildInfoString,
             "version:%s;arch:x86_64;buildtype:Release;buildid:1;commit:fake;branch:fake",
             FAKE_DCGM_MAJOR >= 4 ? "4.6.0" : "3.3.9");
    return ST_OK;
}

int dcgmShutdown(void) {
    ENTER("dcgmShutdown");
    g_initialized = 0;
    return ST_OK;
}

int dcgmStartEmbedded(int mode, dcgmHandle_t *handle) {
    ENTER("dcgmStartEmbedded");
    if (!g_initialized) return ST_UNINITIALIZED;
    if (!handle || (mode != 1 && mode != 2)) return ST_BADPARAM;
    reset_groups(); /* a new host engine: no groups yet */
    *handle = g_handle = 0x1000 + (uintptr_t)mode;
    return ST_OK;
}

int dcgmStopEmbedded(dcgmHandle_t handle) {
    ENTER("dcgmStopEmbedded");
    return handle == g_handle ? ST_OK : ST_BADPARAM;
}

int dcgmConnect_v2(const char *address, dcgmConnectV2Params_v2 *params, dcgmHandle_t *handle) {
    ENTER("dcgmConnect_v2");
    if (!g_initialized) return ST_UNINITIALIZED;
    if (!params || params->version != MAKE_DCGM_VERSION(dcgmConnectV2Params_v2, 2))
        return ST_VER_MISMATCH;
    if (!address || !*address) return ST_BADPARAM;
    reset_groups();
    *handle = g_handle = 0x2000;
    return ST_OK;
}

int dcgmDisconnect(dcgmHandle_t handle) {
    ENTER("dcgmDisconnect");
    return handle == g_handle ? ST_OK : ST_BADPARAM;
}

int dcgmGetAllSupportedDevices(dcgmHandle_t handle, unsigned int *ids, int *count) {
    ENTER("dcgmGetAllSupportedDevices");
    if (handle != g_handle) return ST_CONNECTION_NOT_VALID;
    *count = gpu_count();
    for (int i = 0; i < *count; i++) ids[i] = (unsigned int)i;
    return ST_OK;
}

int dcgmGetEntityGroupEntities(dcgmHandle_t handle, unsigned int entity_group,
                               unsigned int *entities, int *count, unsigned int flags) {
    ENTER("dcgmGetEntityGroupEntities");
    (void)flags;
    if (handle != g_handle) return ST_CONNECTION_NOT_VALID;
    if (!entities || !count) return ST_BADPARAM;
    int found = entity_count(entity_group);
    if (found < 0) return ST_NOT_SUPPORTED; /* DcgmCacheManager: an unknown entity group */
    int capacity = *count;
    *count = found;
    if (found > capacity) return ST_INSUFFICIENT_SIZE;
    for (int i = 0; i < found; i++) entities[i] = (unsigned int)i;
    return ST_OK;
}

/* types: DCGM_GROUP_DEFAULT 0 (every GPU), EMPTY 1, DEFAULT_NVSWITCHES 2 (every switch) */
int dcgmGroupCreate(dcgmHandle_t handle, int type, const char *name, dcgmGpuGrp_t *group) {
    ENTER("dcgmGroupCreate");
    if (handle != g_handle) return ST_CONNECTION_NOT_VALID;
    if (!name || !group || type < 0 || type > 5) return ST_BADPARAM;
    if (g_next_group >= MAX_GROUPS) return -24; /* DCGM_ST_MAX_LIMIT */
    struct group *g = &g_groups[g_next_group];
    memset(g, 0, sizeof *g);
    g->used = 1;
    if (type == 0)
        for (int i = 0; i < gpu_count(); i++) group_add(g, FE_GPU, (unsigned int)i);
    if (type == 2)
        for (int i = 0; i < entity_count(FE_SWITCH); i++) group_add(g, FE_SWITCH, (unsigned int)i);
    *group = g_next_group++;
    return ST_OK;
}

int dcgmGroupAddEntity(dcgmHandle_t handle, dcgmGpuGrp_t group, unsigned int entity_group,
                       unsigned int id) {
    ENTER("dcgmGroupAddEntity");
    if (handle != g_handle) return ST_CONNECTION_NOT_VALID;
    struct group *g = group_of(group);
    if (!g || (int)id >= entity_count(entity_group)) return ST_BADPARAM;
    group_add(g, entity_group, id);
    return ST_OK;
}

int dcgmGroupAddDevice(dcgmHandle_t handle, dcgmGpuGrp_t group, unsigned int gpu) {
    ENTER("dcgmGroupAddDevice");
    if (handle != g_handle) return ST_CONNECTION_NOT_VALID;
    struct group *g = group_of(group);
    if (!g || (int)gpu >= gpu_count()) return ST_BADPARAM;
    group_add(g, FE_GPU, gpu);
    return ST_OK;
}

int dcgmFieldGroupCreate(dcgmHandle_t handle, int n, unsigned short *ids, const char *name,
                         dcgmFieldGrp_t *fgroup) {
    ENTER("dcgmFieldGroupCreate");
    if (handle != g_handle) return ST_CONNECTION_NOT_VALID;
    if (n <= 0 || n > 128 || !ids || !name) return ST_BADPARAM;
    g_watched_count = n; /* one field group at a time: the high bit marks "not yet watched" */
    for (int i = 0; i < n; i++) g_watched[i] = ids[i] | 0x8000;
    *fgroup = g_next_group++;
    return ST_OK;
}

int dcgmWatchFields(dcgmHandle_t handle, dcgmGpuGrp_t group, dcgmFieldGrp_t fgroup,
                    long long freq_us, double keep_age, int keep_samples) {
    ENTER("dcgmWatchFields");
    if (handle != g_handle) return ST_CONNECTION_NOT_VALID;
    if (!group || !fgroup || freq_us <= 0 || keep_age < 0 || keep_samples < 0) return ST_BADPARAM;
    for (int i = 0; i < g_watched_count; i++) g_watched[i] &= 0x7fff;
    return ST_OK;
}

int dcgmUpdateAllFields(dcgmHandle_t handle, int wait) {
    ENTER("dcgmUpdateAllFields");
    if (handle != g_handle) return ST_CONNECTION_NOT_VALID;
    (void)wait;
    g_updates++;
    return ST_OK;
}

static int is_watched(unsigned short field) {
    for (int i = 0; i < g_watched_count; i++)
        if (g_watched[i] == field) return 1;
    return 0;
}

int dcgmGetLatestValuesForFields(dcgmHandle_t handle, int gpu, unsigned short *fields,
                                 unsigned int count, dcgmFieldValue_v1 *values) {
    ENTER("dcgmGetLatestValuesForFields");
    if (handle != g_handle) return ST_CONNECTION_NOT_VALID;
    if (gpu < 0 || gpu >= gpu_count() || !fields || !values) return ST_BADPARAM;
    for (unsigned int k = 0; k < count; k++) {
        dcgmFieldValue_v1 *v = &values[k];
        if (v->version != MAKE_DCGM_VERSION(dcgmFieldValue_v1, 1)) return ST_VER_MISMATCH;
        v->fieldId = fields[k];
        v->ts = (int64_t)time(NULL) * 1000000;
        v->status = is_watched(fields[k]) ? ST_NO_DATA : ST_NOT_WATCHED;
        if (v->status == ST_NOT_WATCHED || !g_updates) continue; /* no sample before an update */
        for (int i = 0; i < g_line_count; i++) {
            int g, f;
            char type;
            if (sscanf(g_lines[i], "value %d %d %c", &g, &f, &type) != 3) continue;
            if (g != gpu || f != fields[k]) continue;
            const char *text = rest_after(g_lines[i], 4);
            v->fieldType = (unsigned short)type;
            v->status = ST_OK;
            if (type == 'd') v->value.dbl = atof(text);
            else if (type == 'i') v->value.i64 = atoll(text);
            else snprintf(v->value.str, sizeof v->value.str, "%s", text);
        }
    }
    return ST_OK;
}

int dcgmHealthSet(dcgmHandle_t handle, dcgmGpuGrp_t group, unsigned int systems) {
    ENTER("dcgmHealthSet");
    if (handle != g_handle) return ST_CONNECTION_NOT_VALID;
    struct group *g = group_of(group);
    if (!g) return ST_BADPARAM;
    g->systems = systems;
    return ST_OK;
}

/* "3", "gpu:3", "switch:0", "cx:1" → entity group and id */
static int parse_entity(const char *text, unsigned int *entity_group, unsigned int *id) {
    if (sscanf(text, "gpu:%u", id) == 1) *entity_group = FE_GPU;
    else if (sscanf(text, "switch:%u", id) == 1) *entity_group = FE_SWITCH;
    else if (sscanf(text, "cx:%u", id) == 1) *entity_group = FE_CONNECTX;
    else if (sscanf(text, "%u", id) == 1) *entity_group = FE_GPU;
    else return 0;
    return 1;
}

/* The entities a health system is evaluated for (DcgmHealthWatch::MonitorEntity...). */
static int system_applies(unsigned int system, unsigned int entity_group) {
    if (system & SYSTEM_NVSWITCH) return entity_group == FE_SWITCH;
    if (system & SYSTEM_CONNECTX) return entity_group == FE_CONNECTX;
    return entity_group == FE_GPU;
}

/* DCGM 3 answers only dcgmHealthResponse_v4, DCGM 4 only dcgmHealthResponse_v5. */
int dcgmHealthCheck(dcgmHandle_t handle, dcgmGpuGrp_t group, void *response) {
    ENTER("dcgmHealthCheck");
    if (handle != g_handle) return ST_CONNECTION_NOT_VALID;
    struct group *g = group_of(group);
    if (!g || !response) return ST_BADPARAM;
    unsigned int version = *(unsigned int *)response, limit;
    dcgmIncidentInfo_t *incidents;
    unsigned int *overall, *count;
    if (FAKE_DCGM_MAJOR >= 4) {
        if (version != MAKE_DCGM_VERSION(dcgmHealthResponse_v5, 5)) return ST_VER_MISMATCH;
        dcgmHealthResponse_v5 *out = response;
        incidents = out->incidents, overall = &out->overallHealth, count = &out->incidentCount;
        limit = MAX_INCIDENTS_V2;
    } else {
        if (version != MAKE_DCGM_VERSION(dcgmHealthResponse_v4, 4)) return ST_VER_MISMATCH;
        dcgmHealthResponse_v4 *out = response;
        incidents = out->incidents, overall = &out->overallHealth, count = &out->incidentCount;
        limit = MAX_INCIDENTS;
    }
    *overall = 0;
    *count = 0;
    for (int i = 0; i < g_line_count && *count < limit; i++) {
        unsigned int system, health, entity_group, id, code;
        char entity[32];
        if (sscanf(g_lines[i], "incident %u %u %31s %u", &system, &health, entity, &code) != 4)
            continue;
        if (!parse_entity(entity, &entity_group, &id)) continue;
        if (!(system & g->systems) || !system_applies(system, entity_group)) continue;
        if (!group_has(g, entity_group, id)) continue;
        dcgmIncidentInfo_t *inc = &incidents[(*count)++];
        inc->system = system;
        inc->health = health;
        inc->error.code = code;
        snprintf(inc->error.msg, sizeof inc->error.msg, "%s", rest_after(g_lines[i], 5));
        inc->entityInfo.entityGroupId = entity_group;
        inc->entityInfo.entityId = id;
        if (health > *overall) *overall = health;
    }
    return ST_OK;
}

static void set_result(dcgmDiagTestResult_v2 *r, unsigned int status, unsigned int code,
                       const char *msg) {
    r->status = status;
    r->error.code = code;
    snprintf(r->error.msg, sizeof r->error.msg, "%s", msg);
}

int dcgmActionValidate_v2(dcgmHandle_t handle, dcgmRunDiag_v7 *request,
                          dcgmDiagResponse_v8 *out) {
    ENTER("dcgmActionValidate_v2");
    if (handle != g_handle) return ST_CONNECTION_NOT_VALID;
    if (!request || request->version != MAKE_DCGM_VERSION(dcgmRunDiag_v7, 7)) return ST_VER_MISMATCH;
    if (!out || out->version != MAKE_DCGM_VERSION(dcgmDiagResponse_v8, 8)) return ST_VER_MISMATCH;
    if (!request->groupId || request->validate < 1 || request->validate > 4) return ST_BADPARAM;
    /* tests each level adds: software at 1; memory, diagnostic, pcie at 2; stress at 3 ... */
    static const int first_level[PER_GPU_TESTS] = {2, 2, 2, 3, 3, 3, 3, 4, 4, 9, 9, 9, 9};
    int gpus = gpu_count();
    out->gpuCount = (unsigned int)gpus;
    out->levelOneTestCount = 10;
    for (int t = 0; t < 10; t++) set_result(&out->levelOneResults[t], 0, 0, "");
    for (int g = 0; g < gpus; g++) {
        out->perGpuResponses[g].gpuId = (unsigned int)g;
        for (int t = 0; t < PER_GPU_TESTS; t++)
            set_result(&out->perGpuResponses[g].results[t],
                       first_level[t] <= (int)request->validate ? 0 : 4, 0, "");
    }
    for (int i = 0; i < g_line_count; i++) {
        char who[16];
        int index;
        unsigned int result, code;
        if (sscanf(g_lines[i], "diag %15s %d %u %u", who, &index, &result, &code) != 4) continue;
        const char *msg = rest_after(g_lines[i], 5);
        if (strcmp(who, "sw") == 0 && index >= 0 && index < 10)
            set_result(&out->levelOneResults[index], result, code, msg);
        else if (atoi(who) < gpus && index >= 0 && index < PER_GPU_TESTS &&
                 first_level[index] <= (int)request->validate)
            set_result(&out->perGpuResponses[atoi(who)].results[index], result, code, msg);
    }
    return ST_OK;
}
