/* The fake NVML's event sets, field values and fabric info. An event set refuses a mask with
 * a type the GPU does not support ("supported_events") as the real library does: nothing is
 * registered and NVML_ERROR_NOT_SUPPORTED comes back, so the caller must fall back. Field
 * values (memory temperature, NVLink throughput, the GPU recovery action) and the fabric
 * info structs (v1, and the versioned v2/v3 with their health mask) follow nvml.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake.h"

/* the types a GPU supports unless the scenario says otherwise: SBE, DBE, PState, Xid,
 * clock, GPU recovery action */
#define DEFAULT_EVENTS 0x801fULL
#define FI_MEMORY_TEMP 82
#define FI_NVLINK_THROUGHPUT_DATA_TX 138
#define FI_NVLINK_THROUGHPUT_DATA_RX 139
#define FI_GPU_RECOVERY_ACTION 230
#define VALUE_UNSIGNED_INT 1
#define VALUE_UNSIGNED_LONG_LONG 3
#define FABRIC_INFO_V2 (36U | (2U << 24))
#define FABRIC_INFO_V3 (40U | (3U << 24))

struct event_set {
	ull mask[MAX_GPUS];
	int cursor;
};

typedef struct {
	struct device *device;
	ull eventType;
	ull eventData;
	unsigned int gpuInstanceId, computeInstanceId;
} event_data_t;

typedef struct {
	unsigned int fieldId, scopeId;
	long long timestamp, latencyUsec;
	unsigned int valueType, nvmlReturn;
	union {
		double dVal;
		unsigned int uiVal;
		ull ullVal;
	} value;
} field_value_t;

typedef struct {
	unsigned int version;
	unsigned char clusterUuid[16];
	int status;
	unsigned int cliqueId, state, healthMask;
	unsigned char healthSummary;
} fabric_info_v3_t;

static ull supported_events(int gpu)
{
	return num(gpu, "supported_events", DEFAULT_EVENTS);
}

int nvmlEventSetCreate(struct event_set **out)
{
	if (!initialised)
		return ERR_UNINITIALIZED;
	*out = calloc(1, sizeof(**out));
	return *out ? OK : ERR_UNKNOWN;
}

int nvmlDeviceGetSupportedEventTypes(struct device *dev, ull *types)
{
	GUARD(dev, "nvmlDeviceGetSupportedEventTypes");
	*types = supported_events(dev->index);
	return OK;
}

int nvmlDeviceRegisterEvents(struct device *dev, ull types, struct event_set *set)
{
	GUARD(dev, "nvmlDeviceRegisterEvents");
	if (!set || !types)
		return ERR_INVALID_ARGUMENT;
	if (types & ~supported_events(dev->index))
		return ERR_NOT_SUPPORTED; /* none of the requested types is registered */
	set->mask[dev->index] |= types;
	return OK;
}

int nvmlEventSetFree(struct event_set *set)
{
	free(set);
	return OK;
}

/* The next registered event ("event" lines: "TYPE DATA") after the set's cursor. */
static int next_event(struct event_set *set, ull *type, ull *data, double *t)
{
	for (int i = set->cursor; i < n_entries; i++) {
		struct entry *e = &entries[i];

		if (strcmp(e->key, "event") != 0 || e->gpu < 0 || e->gpu >= MAX_GPUS)
			continue;
		if (sscanf(e->value, "%llu %llu", type, data) != 2 || !(set->mask[e->gpu] & *type))
			continue;
		*t = e->t;
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
		double t = 0;
		int i = next_event(set, &type, &data, &t);
		double now = now_s();

		if (i >= 0 && t <= now) {
			memset(out, 0, sizeof(*out));
			out->device = &devices[entries[i].gpu];
			out->eventType = type;
			out->eventData = data;
			out->gpuInstanceId = 0xFFFFFFFFU;
			out->computeInstanceId = 0xFFFFFFFFU;
			set->cursor = i + 1;
			return OK;
		}
		if (now >= deadline)
			return ERR_TIMEOUT;
		sleep_s(i >= 0 && t < deadline ? t - now : deadline - now);
	}
}

int nvmlEventSetWait(struct event_set *set, event_data_t *out, unsigned int timeout_ms)
{
	return nvmlEventSetWait_v2(set, out, timeout_ms);
}

static void field_value(int gpu, field_value_t *fv)
{
	fv->nvmlReturn = OK;
	fv->valueType = VALUE_UNSIGNED_LONG_LONG;
	switch (fv->fieldId) {
	case FI_MEMORY_TEMP:
		if (!prop(gpu, "memory_temperature_c"))
			fv->nvmlReturn = ERR_NOT_SUPPORTED;
		fv->valueType = VALUE_UNSIGNED_INT;
		fv->value.uiVal = (unsigned int)num(gpu, "memory_temperature_c", 0);
		break;
	case FI_NVLINK_THROUGHPUT_DATA_TX:
	case FI_NVLINK_THROUGHPUT_DATA_RX:
		if (!num(gpu, "nvlink_links", 0))
			fv->nvmlReturn = ERR_NOT_SUPPORTED;
		fv->value.ullVal = num(gpu, fv->fieldId == FI_NVLINK_THROUGHPUT_DATA_TX ?
						    "nvlink_tx_kib" :
						    "nvlink_rx_kib",
				       0);
		break;
	case FI_GPU_RECOVERY_ACTION:
		fv->valueType = VALUE_UNSIGNED_INT;
		fv->value.uiVal = (unsigned int)num(gpu, "recovery_action", 0);
		break;
	default:
		fv->nvmlReturn = ERR_NOT_SUPPORTED;
	}
}

int nvmlDeviceGetFieldValues(struct device *dev, int count, field_value_t *values)
{
	GUARD(dev, "nvmlDeviceGetFieldValues");
	if (count <= 0 || !values)
		return ERR_INVALID_ARGUMENT;
	for (int i = 0; i < count; i++) {
		values[i].timestamp = (long long)(now_s() * 1e6);
		values[i].latencyUsec = 0;
		field_value(dev->index, &values[i]);
	}
	return OK;
}

/* nvmlGpuFabricInfo_t (v1): no version field, no health mask. */
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

int nvmlDeviceGetGpuFabricInfoV(struct device *dev, fabric_info_v3_t *info)
{
	const char *state;
	unsigned int version;

	GUARD(dev, "nvmlDeviceGetGpuFabricInfoV");
	if (!info)
		return ERR_INVALID_ARGUMENT;
	version = info->version;
	if (version != FABRIC_INFO_V2 && version != FABRIC_INFO_V3)
		return ERR_ARGUMENT_VERSION_MISMATCH;
	if (version == FABRIC_INFO_V3 && num(dev->index, "fabric_info_max_version", 3) < 3)
		return ERR_ARGUMENT_VERSION_MISMATCH; /* an older driver knows v2 only */
	state = prop(dev->index, "fabric_state");
	if (!state)
		return ERR_NOT_SUPPORTED;
	memset(info->clusterUuid, 0, sizeof(info->clusterUuid));
	info->status = (int)num(dev->index, "fabric_status", 0);
	info->cliqueId = (unsigned int)num(dev->index, "fabric_clique", 1);
	info->state = (unsigned int)strtoul(state, NULL, 10);
	info->healthMask = (unsigned int)num(dev->index, "fabric_health_mask", 0);
	if (version == FABRIC_INFO_V3)
		info->healthSummary = (unsigned char)num(dev->index, "fabric_health_summary", 0);
	return OK;
}
