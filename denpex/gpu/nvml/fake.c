/* A stand-in libnvidia-ml.so.1 that answers the NVML calls denpex makes from a scenario, so
 * the real pynvml and the real collector run end to end without a GPU. It never touches
 * hardware. The scenario is the line file that denpex/gpu/nvml/scenario.py writes (path in
 * DENPEX_FAKE_NVML_SCENARIO): one "T<tab>GPU<tab>KEY<tab>VALUE" per line, sorted by T,
 * where T is seconds since nvmlInit and GPU -1 means the whole system. The latest line of a
 * key whose T has passed is its value. Same symbol names and struct layouts as the real
 * library (the _v2/_v3 variants pynvml looks up), and the same refusals: a lost GPU, one
 * that needs a reset, a query this user may not make, an unknown error, a query that MIG
 * mode turns off (see guard()). This file: the scenario, devices and per-GPU queries;
 * fake_mig.c and fake_events.c hold the rest. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake.h"

typedef struct {
	char busIdLegacy[16];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32];
} pci_info_t;

typedef struct {
	unsigned int pid;
	ull usedGpuMemory;
	unsigned int gpuInstanceId, computeInstanceId;
} process_info_t;

struct entry *entries;
int n_entries;
static struct timespec started;
int initialised;
struct device devices[MAX_GPUS];
struct device mig_devices[MAX_GPUS][MAX_MIG];

double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)(ts.tv_sec - started.tv_sec) + (ts.tv_nsec - started.tv_nsec) / 1e9;
}

void sleep_s(double seconds)
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
const char *prop(int gpu, const char *key)
{
	const char *found = NULL;
	double now = now_s();

	for (int i = 0; i < n_entries && entries[i].t <= now; i++)
		if (entries[i].gpu == gpu && strcmp(entries[i].key, key) == 0)
			found = entries[i].value;
	return found;
}

ull num(int gpu, const char *key, ull fallback)
{
	const char *value = prop(gpu, key);

	return value && *value ? strtoull(value, NULL, 0) : fallback;
}

int gpu_count(void)
{
	int count = (int)num(-1, "gpu_count", 0);

	return count > MAX_GPUS ? MAX_GPUS : count;
}

void copy_str(char *out, unsigned int size, const char *value)
{
	if (size)
		snprintf(out, size, "%s", value ? value : "");
}

const char *mig_key(const struct device *dev, const char *name)
{
	static __thread char key[96];

	snprintf(key, sizeof(key), "mig%d_%s", dev->mig, name);
	return key;
}

static int known_device(const struct device *dev)
{
	if (!dev || dev->index < 0 || dev->index >= gpu_count())
		return 0;
	if (dev->mig < 0)
		return dev == &devices[dev->index];
	return dev->mig < MAX_MIG && dev == &mig_devices[dev->index][dev->mig];
}

/* The calls NVML answers for a MIG device handle; any other is not supported on one. */
static int mig_capable(const char *fn)
{
	static const char *const capable[] = {
		"nvmlDeviceGetUUID",		   "nvmlDeviceGetName",
		"nvmlDeviceGetMemoryInfo",	   "nvmlDeviceGetMemoryInfo_v2",
		"nvmlDeviceGetComputeInstanceId",  "nvmlDeviceGetGpuInstanceId",
		"nvmlDeviceGetComputeRunningProcesses_v3",
	};

	for (size_t i = 0; i < sizeof(capable) / sizeof(capable[0]); i++)
		if (strcmp(fn, capable[i]) == 0)
			return 1;
	return 0;
}

/* What every device call does first: hang if the scenario says so, then fail like the
 * real library for a lost GPU, one that needs a reset, an error the scenario injects
 * ("error:<function>" = an NVML return code) or an unsupported query. */
int guard(struct device *dev, const char *fn)
{
	char key[128];
	const char *hang;
	int gpu;

	if (!initialised)
		return ERR_UNINITIALIZED;
	if (!known_device(dev))
		return ERR_INVALID_ARGUMENT;
	gpu = dev->index;
	snprintf(key, sizeof(key), "hang:%s", fn);
	hang = prop(gpu, key);
	if (hang && *hang)
		sleep_s(strtod(hang, NULL));
	if (num(gpu, "lost", 0))
		return ERR_GPU_IS_LOST;
	if (num(gpu, "reset_required", 0))
		return ERR_RESET_REQUIRED;
	snprintf(key, sizeof(key), "error:%s", fn);
	if (num(gpu, key, 0))
		return (int)num(gpu, key, 0);
	snprintf(key, sizeof(key), "unsupported:%s", fn);
	if (num(gpu, key, 0))
		return ERR_NOT_SUPPORTED;
	if (dev->mig >= 0 && !mig_capable(fn))
		return ERR_NOT_SUPPORTED;
	return OK;
}

/* Queries NVML refuses on a GPU while MIG mode is on (nvml.h: utilization, encoder and
 * decoder utilization, remapped rows): they come back when MIG is turned off. */
#define NOT_WHILE_MIG(dev)                                                                 \
	do {                                                                               \
		if (num((dev)->index, "mig_mode", 0))                                      \
			return ERR_NOT_SUPPORTED;                                          \
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
	for (int i = 0; i < MAX_GPUS; i++) {
		devices[i] = (struct device){.index = i, .mig = -1};
		for (int m = 0; m < MAX_MIG; m++)
			mig_devices[i][m] = (struct device){.index = i, .mig = m};
	}
	clock_gettime(CLOCK_MONOTONIC, &started);
	if (num(-1, "init_error", 0))
		return (int)num(-1, "init_error", 0);
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
	case ERR_UNINITIALIZED:
		return "Uninitialized";
	case ERR_INVALID_ARGUMENT:
		return "Invalid Argument";
	case ERR_NOT_SUPPORTED:
		return "Not Supported";
	case ERR_NO_PERMISSION:
		return "Insufficient Permissions";
	case ERR_NOT_FOUND:
		return "Not Found";
	case ERR_INSUFFICIENT_SIZE:
		return "Insufficient Size";
	case ERR_DRIVER_NOT_LOADED:
		return "Driver Not Loaded";
	case ERR_TIMEOUT:
		return "Timeout";
	case ERR_GPU_IS_LOST:
		return "GPU is lost";
	case ERR_RESET_REQUIRED:
		return "GPU requires reset";
	case ERR_ARGUMENT_VERSION_MISMATCH:
		return "Argument version mismatch";
	case ERR_GPU_NOT_FOUND:
		return "GPU not found";
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
	char key[96];

	if (!initialised)
		return ERR_UNINITIALIZED;
	if ((int)index >= gpu_count())
		return ERR_INVALID_ARGUMENT;
	*out = &devices[index];
	snprintf(key, sizeof(key), "error:%s", "nvmlDeviceGetHandleByIndex_v2");
	if (num((int)index, key, 0))
		return (int)num((int)index, key, 0);
	return num((int)index, "lost", 0) ? ERR_GPU_IS_LOST : OK;
}

/* A string property; a MIG device reads its own (mig<slot>_<key>) on its parent GPU. */
#define STR_GETTER(fn, key)                                                                \
	int fn(struct device *dev, char *out, unsigned int size)                           \
	{                                                                                  \
		GUARD(dev, #fn);                                                           \
		copy_str(out, size,                                                        \
			 prop(dev->index, dev->mig < 0 ? key : mig_key(dev, key)));        \
		return OK;                                                                 \
	}

STR_GETTER(nvmlDeviceGetUUID, "uuid")
STR_GETTER(nvmlDeviceGetSerial, "serial")
STR_GETTER(nvmlDeviceGetName, "name")
STR_GETTER(nvmlDeviceGetVbiosVersion, "vbios_version")

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
	NOT_WHILE_MIG(dev);
	out[0] = (unsigned int)num(dev->index, "utilization_gpu", 0);
	out[1] = (unsigned int)num(dev->index, "utilization_memory", 0);
	return OK;
}

static int codec_utilization(struct device *dev, const char *fn, const char *key,
			     unsigned int *util, unsigned int *period_us)
{
	GUARD(dev, fn);
	NOT_WHILE_MIG(dev);
	*util = (unsigned int)num(dev->index, key, 0);
	*period_us = 167000;
	return OK;
}

int nvmlDeviceGetEncoderUtilization(struct device *dev, unsigned int *util, unsigned int *period)
{
	return codec_utilization(dev, "nvmlDeviceGetEncoderUtilization", "utilization_encoder",
				 util, period);
}

int nvmlDeviceGetDecoderUtilization(struct device *dev, unsigned int *util, unsigned int *period)
{
	return codec_utilization(dev, "nvmlDeviceGetDecoderUtilization", "utilization_decoder",
				 util, period);
}

/* Total, reserved, free and used bytes of a GPU, or of a MIG device's slice of it. */
static void memory(const struct device *dev, ull *total, ull *reserved, ull *free_bytes,
		   ull *used)
{
	int gpu = dev->index;
	int mig = dev->mig >= 0;

	*total = num(gpu, mig ? mig_key(dev, "memory_total_mib") : "memory_total_mib", 0) << 20;
	*used = num(gpu, mig ? mig_key(dev, "memory_used_mib") : "memory_used_mib", 0) << 20;
	*reserved = mig ? 0 : num(gpu, "memory_reserved_mib", 0) << 20;
	*free_bytes = *total > *used + *reserved ? *total - *used - *reserved : 0;
}

int nvmlDeviceGetMemoryInfo(struct device *dev, ull out[3])
{
	ull reserved;

	GUARD(dev, "nvmlDeviceGetMemoryInfo");
	memory(dev, &out[0], &reserved, &out[1], &out[2]);
	return OK;
}

/* nvmlMemory_v2_t: version, then total, reserved, free, used (8-byte aligned). */
int nvmlDeviceGetMemoryInfo_v2(struct device *dev, void *raw)
{
	ull *out = (ull *)((char *)raw + 8);

	GUARD(dev, "nvmlDeviceGetMemoryInfo_v2");
	if (*(unsigned int *)raw != (40U | (2U << 24)))
		return ERR_ARGUMENT_VERSION_MISMATCH;
	memory(dev, &out[0], &out[1], &out[2], &out[3]);
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
NUM_GETTER(nvmlDeviceGetTotalEnergyConsumption, ull, "energy_mj", 0)
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
	NOT_WHILE_MIG(dev);
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
	value = prop(dev->index, dev->mig < 0 ? "processes" : mig_key(dev, "processes"));
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
