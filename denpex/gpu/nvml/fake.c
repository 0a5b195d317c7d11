/* A stand-in libnvidia-ml.so.1 that answers the NVML calls denpex makes from a scenario, so
 * the real pynvml and the real collector run end to end without a GPU. It never touches
 * hardware. The scenario is the line file that denpex/gpu/nvml/scenario.py writes (path in
 * DENPEX_FAKE_NVML_SCENARIO): one "T<tab>GPU<tab>KEY<tab>VALUE" per line, sorted by T,
 * where T is seconds since nvmlInit and GPU -1 means the whole system. The latest line of a
 * key whose T has passed is its value. Same symbol names and struct layouts as the real
 * library (the _v2/_v3 variants pynvml looks up). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OK 0
#define ERR_UNINITIALIZED 1
#define ERR_INVALID_ARGUMENT 2
#define ERR_NOT_SUPPORTED 3
#define ERR_NOT_FOUND 6
#define ERR_INSUFFICIENT_SIZE 7
#define ERR_DRIVER_NOT_LOADED 9
#define ERR_TIMEOUT 10
#define ERR_GPU_IS_LOST 15
#define ERR_UNKNOWN 999
#define MAX_GPUS 64

typedef unsigned long long ull;

struct entry {
	double t;
	int gpu;
	char key[96];
	char value[256];
};

struct device {
	int index;
};

struct event_set {
	ull mask[MAX_GPUS];
	int cursor;
};

typedef struct {
	char busIdLegacy[16];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32];
} pci_info_t;

typedef struct {
	struct device *device;
	ull eventType;
	ull eventData;
	unsigned int gpuInstanceId, computeInstanceId;
} event_data_t;

typedef struct {
	unsigned int pid;
	ull usedGpuMemory;
	unsigned int gpuInstanceId, computeInstanceId;
} process_info_t;

static struct entry *entries;
static int n_entries;
static int initialised;
static struct timespec started;
static struct device devices[MAX_GPUS];

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)(ts.tv_sec - started.tv_sec) + (ts.tv_nsec - started.tv_nsec) / 1e9;
}

static void sleep_s(double seconds)
{
	struct timespec ts;

	if (seconds <= 0)
		return;
	ts.tv_sec = (time_t)seconds;
	ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
	while (nanosleep(&ts, &ts) != 0)
		;
}

static int load(const char *path)
{
	FILE *f = fopen(path, "r");
	char line[512];
	int capacity = 256;

	if (!f)
		return -1;
	free(entries);
	n_entries = 0;
	entries = calloc((size_t)capacity, sizeof(*entries));
	while (entries && fgets(line, sizeof(line), f)) {
		struct entry *e;
		char *t = strtok(line, "\t"), *gpu = strtok(NULL, "\t");
		char *key = strtok(NULL, "\t"), *value = strtok(NULL, "\n");

		if (!t || !gpu || !key || t[0] == '#')
			continue;
		if (n_entries == capacity) {
			capacity *= 2;
			entries = realloc(entries, (size_t)capacity * sizeof(*entries));
			if (!entries)
				break;
		}
		e = &entries[n_entries++];
		e->t = strtod(t, NULL);
		e->gpu = atoi(gpu);
		snprintf(e->key, sizeof(e->key), "%s", key);
		snprintf(e->value, sizeof(e->value), "%s", value ? value : "");
	}
	fclose(f);
	return entries ? 0 : -1;
}

/* The value of KEY for GPU now, or NULL when no line has set it yet. */
static const char *prop(int gpu, const char *key)
{
	const char *found = NULL;
	double now = now_s();

	for (int i = 0; i < n_entries && entries[i].t <= now; i++)
		if (entries[i].gpu == gpu && strcmp(entries[i].key, key) == 0)
			found = entries[i].value;
	return found;
}

static ull num(int gpu, const char *key, ull fallback)
{
	const char *value = prop(gpu, key);

	return value && *value ? strtoull(value, NULL, 10) : fallback;
}

static int gpu_count(void)
{
	int count = (int)num(-1, "gpu_count", 0);

	return count > MAX_GPUS ? MAX_GPUS : count;
}

static void copy_str(char *out, unsigned int size, const char *value)
{
	if (size)
		snprintf(out, size, "%s", value ? value : "");
}

/* What every device call does first: hang if the scenario says so, then fail like the
 * real library for a lost GPU or an unsupported query. */
static int guard(struct device *dev, const char *fn)
{
	char key[128];
	const char *hang;

	if (!initialised)
		return ERR_UNINITIALIZED;
	if (!dev || dev->index < 0 || dev->index >= gpu_count())
		return ERR_INVALID_ARGUMENT;
	snprintf(key, sizeof(key), "hang:%s", fn);
	hang = prop(dev->index, key);
	if (hang && *hang)
		sleep_s(strtod(hang, NULL));
	if (num(dev->index, "lost", 0))
		return ERR_GPU_IS_LOST;
	snprintf(key, sizeof(key), "unsupported:%s", fn);
	if (num(dev->index, key, 0))
		return ERR_NOT_SUPPORTED;
	return OK;
}

#define GUARD(dev, fn)                                                                     \
	do {                                                                               \
		int guarded = guard((dev), (fn));                                          \
		if (guarded != OK)                                                         \
			return guarded;                                                    \
	} while (0)

#define NUM_GETTER(fn, type, key, fallback)                                                \
	int fn(struct device *dev, type *out)                                              \
	{                                                                                  \
		GUARD(dev, #fn);                                                           \
		*out = (type)num(dev->index, key, fallback);                               \
		return OK;                                                                 \
	}

int nvmlInitWithFlags(unsigned int flags)
{
	const char *path = getenv("DENPEX_FAKE_NVML_SCENARIO");

	(void)flags;
	if (!path || load(path) != 0)
		return ERR_DRIVER_NOT_LOADED;
	for (int i = 0; i < MAX_GPUS; i++)
		devices[i].index = i;
	clock_gettime(CLOCK_MONOTONIC, &started);
	initialised = 1;
	return OK;
}

int nvmlInit_v2(void)
{
	return nvmlInitWithFlags(0);
}

int nvmlInit(void)
{
	return nvmlInitWithFlags(0);
}

int nvmlShutdown(void)
{
	initialised = 0;
	return OK;
}

const char *nvmlErrorString(int result)
{
	switch (result) {
	case OK:
		return "Success";
	case ERR_NOT_SUPPORTED:
		return "Not Supported";
	case ERR_GPU_IS_LOST:
		return "GPU is lost";
	case ERR_TIMEOUT:
		return "Timeout";
	default:
		return "Unknown Error";
	}
}

int nvmlSystemGetDriverVersion(char *out, unsigned int size)
{
	if (!initialised)
		return ERR_UNINITIALIZED;
	copy_str(out, size, prop(-1, "driver_version"));
	return OK;
}

int nvmlDeviceGetCount_v2(unsigned int *count)
{
	if (!initialised)
		return ERR_UNINITIALIZED;
	*count = (unsigned int)gpu_count();
	return OK;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, struct device **out)
{
	if (!initialised)
		return ERR_UNINITIALIZED;
	if ((int)index >= gpu_count())
		return ERR_INVALID_ARGUMENT;
	*out = &devices[index];
	return num((int)index, "lost", 0) ? ERR_GPU_IS_LOST : OK;
}

#define STR_GETTER(fn, key)                                                                \
	int fn(struct device *dev, char *out, unsigned int size)                           \
	{                                                                                  \
		GUARD(dev, #fn);                                                           \
		copy_str(out, size, prop(dev->index, key));                                \
		return OK;                                                                 \
	}

STR_GETTER(nvmlDeviceGetUUID, "uuid")
STR_GETTER(nvmlDeviceGetSerial, "serial")
STR_GETTER(nvmlDeviceGetName, "name")

int nvmlDeviceGetPciInfo_v3(struct device *dev, pci_info_t *out)
{
	const char *bus_id;

	GUARD(dev, "nvmlDeviceGetPciInfo_v3");
	memset(out, 0, sizeof(*out));
	bus_id = prop(dev->index, "pci_bus_id");
	copy_str(out->busId, sizeof(out->busId), bus_id);
	copy_str(out->busIdLegacy, sizeof(out->busIdLegacy), bus_id);
	if (bus_id)
		sscanf(bus_id, "%x:%x:%x", &out->domain, &out->bus, &out->device);
	out->pciDeviceId = (unsigned int)num(dev->index, "pci_device_id", 0x233010de);
	return OK;
}

int nvmlDeviceGetUtilizationRates(struct device *dev, unsigned int out[2])
{
	GUARD(dev, "nvmlDeviceGetUtilizationRates");
	out[0] = (unsigned int)num(dev->index, "utilization_gpu", 0);
	out[1] = (unsigned int)num(dev->index, "utilization_memory", 0);
	return OK;
}

static void memory(int gpu, ull *total, ull *free_bytes, ull *used)
{
	*total = num(gpu, "memory_total_mib", 0) << 20;
	*used = num(gpu, "memory_used_mib", 0) << 20;
	*free_bytes = *total > *used ? *total - *used : 0;
}

int nvmlDeviceGetMemoryInfo(struct device *dev, ull out[3])
{
	GUARD(dev, "nvmlDeviceGetMemoryInfo");
	memory(dev->index, &out[0], &out[1], &out[2]);
	return OK;
}

int nvmlDeviceGetMemoryInfo_v2(struct device *dev, void *raw)
{
	ull *out = (ull *)((char *)raw + 8); /* after the version field and its padding */

	GUARD(dev, "nvmlDeviceGetMemoryInfo_v2");
	out[1] = 0; /* reserved */
	memory(dev->index, &out[0], &out[2], &out[3]);
	return OK;
}

int nvmlDeviceGetTemperature(struct device *dev, int sensor, unsigned int *out)
{
	GUARD(dev, "nvmlDeviceGetTemperature");
	if (sensor != 0)
		return ERR_INVALID_ARGUMENT;
	*out = (unsigned int)num(dev->index, "temperature_c", 40);
	return OK;
}

int nvmlDeviceGetMarginTemperature(struct device *dev, int out[2])
{
	const char *margin;

	GUARD(dev, "nvmlDeviceGetMarginTemperature");
	margin = prop(dev->index, "margin_temperature_c");
	if (!margin)
		return ERR_NOT_SUPPORTED;
	out[1] = atoi(margin);
	return OK;
}

NUM_GETTER(nvmlDeviceGetPowerUsage, unsigned int, "power_mw", 0)
NUM_GETTER(nvmlDeviceGetEnforcedPowerLimit, unsigned int, "power_limit_mw", 700000)
NUM_GETTER(nvmlDeviceGetPowerManagementLimit, unsigned int, "power_limit_mw", 700000)
NUM_GETTER(nvmlDeviceGetCurrentClocksEventReasons, ull, "clocks_event_reasons", 0)
NUM_GETTER(nvmlDeviceGetCurrentClocksThrottleReasons, ull, "clocks_event_reasons", 0)
NUM_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, unsigned int, "pcie_gen", 5)
NUM_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, unsigned int, "pcie_gen_max", 5)
NUM_GETTER(nvmlDeviceGetCurrPcieLinkWidth, unsigned int, "pcie_width", 16)
NUM_GETTER(nvmlDeviceGetMaxPcieLinkWidth, unsigned int, "pcie_width_max", 16)
NUM_GETTER(nvmlDeviceGetPcieReplayCounter, unsigned int, "pcie_replays", 0)

int nvmlDeviceGetClockInfo(struct device *dev, int type, unsigned int *out)
{
	GUARD(dev, "nvmlDeviceGetClockInfo");
	if (type == 1)
		*out = (unsigned int)num(dev->index, "sm_clock_mhz", 1980);
	else if (type == 2)
		*out = (unsigned int)num(dev->index, "mem_clock_mhz", 2619);
	else
		*out = (unsigned int)num(dev->index, "sm_clock_mhz", 1980);
	return OK;
}

int nvmlDeviceGetTotalEccErrors(struct device *dev, int error_type, int counter_type, ull *out)
{
	static const char *keys[2][2] = {{"ecc_sbe_volatile", "ecc_sbe_aggregate"},
					 {"ecc_dbe_volatile", "ecc_dbe_aggregate"}};

	GUARD(dev, "nvmlDeviceGetTotalEccErrors");
	if (error_type < 0 || error_type > 1 || counter_type < 0 || counter_type > 1)
		return ERR_INVALID_ARGUMENT;
	*out = num(dev->index, keys[error_type][counter_type], 0);
	return OK;
}

int nvmlDeviceGetRetiredPages(struct device *dev, int cause, unsigned int *count, ull *addresses)
{
	unsigned int pages;

	GUARD(dev, "nvmlDeviceGetRetiredPages");
	pages = (unsigned int)num(dev->index, cause ? "retired_dbe" : "retired_sbe", 0);
	if (!addresses || *count < pages) {
		*count = pages;
		return pages ? ERR_INSUFFICIENT_SIZE : OK;
	}
	for (unsigned int i = 0; i < pages; i++)
		addresses[i] = 0x1000ULL * (i + 1) + (ull)cause;
	*count = pages;
	return OK;
}

int nvmlDeviceGetRemappedRows(struct device *dev, unsigned int *corrected,
			      unsigned int *uncorrected, unsigned int *pending, unsigned int *failed)
{
	GUARD(dev, "nvmlDeviceGetRemappedRows");
	*corrected = (unsigned int)num(dev->index, "remap_corrected", 0);
	*uncorrected = (unsigned int)num(dev->index, "remap_uncorrected", 0);
	*pending = (unsigned int)num(dev->index, "remap_pending", 0);
	*failed = (unsigned int)num(dev->index, "remap_failed", 0);
	return OK;
}

int nvmlDeviceGetRowRemapperHistogram(struct device *dev, unsigned int out[5])
{
	static const char *keys[5] = {"remap_bank_max", "remap_bank_high", "remap_bank_partial",
				      "remap_bank_low", "remap_bank_none"};

	GUARD(dev, "nvmlDeviceGetRowRemapperHistogram");
	for (int i = 0; i < 5; i++)
		out[i] = (unsigned int)num(dev->index, keys[i], i == 0 ? 8 : 0);
	return OK;
}

int nvmlDeviceGetNvLinkState(struct device *dev, unsigned int link, unsigned int *active)
{
	char key[64];

	GUARD(dev, "nvmlDeviceGetNvLinkState");
	if (link >= num(dev->index, "nvlink_links", 0))
		return link == 0 ? ERR_NOT_SUPPORTED : ERR_INVALID_ARGUMENT;
	snprintf(key, sizeof(key), "nvlink%u_active", link);
	*active = (unsigned int)num(dev->index, key, 1);
	return OK;
}

int nvmlDeviceGetNvLinkErrorCounter(struct device *dev, unsigned int link, int counter, ull *out)
{
	static const char *names[5] = {"replay", "recovery", "crc_flit", "crc_data", "ecc_data"};
	char key[64];

	GUARD(dev, "nvmlDeviceGetNvLinkErrorCounter");
	if (link >= num(dev->index, "nvlink_links", 0) || counter < 0 || counter > 4)
		return ERR_INVALID_ARGUMENT;
	snprintf(key, sizeof(key), "nvlink%u_%s", link, names[counter]);
	*out = num(dev->index, key, 0);
	return OK;
}

int nvmlDeviceGetComputeRunningProcesses_v3(struct device *dev, unsigned int *count,
					    process_info_t *out)
{
	char list[256];
	unsigned int found = 0;
	const char *value;

	GUARD(dev, "nvmlDeviceGetComputeRunningProcesses_v3");
	value = prop(dev->index, "processes");
	copy_str(list, sizeof(list), value);
	for (char *item = strtok(list, ","); item; item = strtok(NULL, ",")) {
		if (out && found < *count) {
			memset(&out[found], 0, sizeof(out[found]));
			out[found].pid = (unsigned int)strtoul(item, NULL, 10);
			out[found].usedGpuMemory = strchr(item, ':') ?
							   strtoull(strchr(item, ':') + 1, NULL, 10) << 20 :
							   0;
		}
		found++;
	}
	if (found && (!out || *count < found)) {
		*count = found;
		return ERR_INSUFFICIENT_SIZE;
	}
	*count = found;
	return OK;
}

int nvmlDeviceGetGpuFabricInfo(struct device *dev, unsigned char *raw)
{
	const char *state;

	GUARD(dev, "nvmlDeviceGetGpuFabricInfo");
	state = prop(dev->index, "fabric_state");
	if (!state)
		return ERR_NOT_SUPPORTED;
	memset(raw, 0, 16);
	((unsigned int *)(raw + 16))[0] = (unsigned int)num(dev->index, "fabric_status", 0);
	((unsigned int *)(raw + 16))[1] = (unsigned int)num(dev->index, "fabric_clique", 1);
	((unsigned int *)(raw + 16))[2] = (unsigned int)strtoul(state, NULL, 10);
	return OK;
}

int nvmlEventSetCreate(struct event_set **out)
{
	if (!initialised)
		return ERR_UNINITIALIZED;
	*out = calloc(1, sizeof(**out));
	return *out ? OK : ERR_UNKNOWN;
}

int nvmlDeviceRegisterEvents(struct device *dev, ull types, struct event_set *set)
{
	GUARD(dev, "nvmlDeviceRegisterEvents");
	if (!set)
		return ERR_INVALID_ARGUMENT;
	set->mask[dev->index] |= types;
	return OK;
}

int nvmlEventSetFree(struct event_set *set)
{
	free(set);
	return OK;
}

/* The next registered event ("event" lines: "TYPE DATA") after the set's cursor. */
static int next_event(struct event_set *set, ull *type, ull *data)
{
	for (int i = set->cursor; i < n_entries; i++) {
		struct entry *e = &entries[i];

		if (strcmp(e->key, "event") != 0 || e->gpu < 0 || e->gpu >= MAX_GPUS)
			continue;
		if (sscanf(e->value, "%llu %llu", type, data) != 2 || !(set->mask[e->gpu] & *type))
			continue;
		return i;
	}
	return -1;
}

int nvmlEventSetWait_v2(struct event_set *set, event_data_t *out, unsigned int timeout_ms)
{
	double deadline = now_s() + timeout_ms / 1000.0;

	if (!initialised)
		return ERR_UNINITIALIZED;
	for (;;) {
		ull type = 0, data = 0;
		int i = next_event(set, &type, &data);
		double now = now_s();

		if (i >= 0 && entries[i].t <= now) {
			memset(out, 0, sizeof(*out));
			out->device = &devices[entries[i].gpu];
			out->eventType = type;
			out->eventData = data;
			set->cursor = i + 1;
			return OK;
		}
		if (now >= deadline)
			return ERR_TIMEOUT;
		sleep_s(i >= 0 && entries[i].t < deadline ? entries[i].t - now : deadline - now);
	}
}

int nvmlEventSetWait(struct event_set *set, event_data_t *out, unsigned int timeout_ms)
{
	return nvmlEventSetWait_v2(set, out, timeout_ms);
}
