/* A stand-in libcupti.so for the SDK's CUPTI tracer tests: the real entry points and ABI of
 * CUPTI 12.x (cupti_result.h, cupti_activity.h, cupti_callbacks.h, cupti_version.h) for the
 * activity buffer API and the callback API, with none of a GPU behind them. The test drives
 * it through the fake_cupti_* functions: a kernel launch calls the subscriber's callback the
 * way the driver API does, a finished kernel becomes a CUpti_ActivityKernel9 record in a
 * buffer the tracer handed over. Never touches a GPU.
 *
 * It says no the way CUPTI does, driven by the environment it is loaded in:
 *   FAKE_CUPTI_API_VERSION=N     what cuptiGetVersion reports (default 24, CUDA 12.6)
 *   FAKE_CUPTI_BUSY=1            another tool holds CUPTI: cuptiSubscribe and
 *                                cuptiActivityRegisterCallbacks return
 *                                CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
 *   FAKE_CUPTI_INCOMPATIBLE=K,.. these activity kinds cannot be enabled (NOT_COMPATIBLE)
 *   FAKE_CUPTI_NOT_INITIALIZED=1 no driver: every call returns CUPTI_ERROR_NOT_INITIALIZED
 * Kinds other than KERNEL (3) and CONCURRENT_KERNEL (10) are CUPTI_ERROR_INVALID_KIND here.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUptiResult;
typedef uint32_t CUpti_ActivityKind;
typedef uint32_t CUpti_CallbackDomain;
typedef uint32_t CUpti_CallbackId;
typedef void *CUcontext;
typedef struct fake_subscriber *CUpti_SubscriberHandle;

enum {
	CUPTI_SUCCESS = 0,
	CUPTI_ERROR_INVALID_PARAMETER = 1,
	CUPTI_ERROR_MAX_LIMIT_REACHED = 12,
	CUPTI_ERROR_NOT_COMPATIBLE = 14,
	CUPTI_ERROR_NOT_INITIALIZED = 15,
	CUPTI_ERROR_INVALID_KIND = 21,
	CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39,
	CUPTI_ERROR_UNKNOWN = 999,
};
enum { KIND_KERNEL = 3, KIND_CONCURRENT_KERNEL = 10 };
enum { CUPTI_API_ENTER = 0, CUPTI_API_EXIT = 1 };
enum { CUPTI_CB_DOMAIN_DRIVER_API = 1, CUPTI_CB_DOMAIN_RUNTIME_API = 2 };
enum { CBID_DRIVER_cuLaunchKernelEx = 652, CBID_RUNTIME_cudaLaunchKernel_v7000 = 211 };

/* cupti_activity.h: PACKED_ALIGNMENT is packed and 8-byte aligned */
#define PACKED_ALIGNMENT __attribute__((__packed__)) __attribute__((aligned(8)))

typedef struct PACKED_ALIGNMENT {
	CUpti_ActivityKind kind;
} CUpti_Activity;

typedef struct PACKED_ALIGNMENT {
	CUpti_ActivityKind kind;
	uint8_t cacheConfig;
	uint8_t sharedMemoryConfig;
	uint16_t registersPerThread;
	uint32_t partitionedGlobalCacheRequested;
	uint32_t partitionedGlobalCacheExecuted;
	uint64_t start;
	uint64_t end;
	uint64_t completed;
	uint32_t deviceId;
	uint32_t contextId;
	uint32_t streamId;
	int32_t gridX, gridY, gridZ;
	int32_t blockX, blockY, blockZ;
	int32_t staticSharedMemory;
	int32_t dynamicSharedMemory;
	uint32_t localMemoryPerThread;
	uint32_t localMemoryTotal;
	uint32_t correlationId;
	int64_t gridId;
	const char *name;
	void *reserved0;
	uint64_t queued;
	uint64_t submitted;
	uint8_t launchType;
	uint8_t isSharedMemoryCarveoutRequested;
	uint8_t sharedMemoryCarveoutRequested;
	uint8_t padding;
	uint32_t sharedMemoryExecuted;
	uint64_t graphNodeId;
	uint32_t shmemLimitConfig;
	uint32_t graphId;
	void *pAccessPolicyWindow;
	uint32_t channelID;
	uint32_t channelType;
	uint32_t clusterX, clusterY, clusterZ;
	uint32_t clusterSchedulingPolicy;
	uint64_t localMemoryTotal_v2;
	uint32_t maxPotentialClusterSize;
	uint32_t maxActiveClusters;
} CUpti_ActivityKernel9;

typedef struct {
	uint32_t callbackSite;
	const char *functionName;
	const void *functionParams;
	void *functionReturnValue;
	const char *symbolName;
	CUcontext context;
	uint32_t contextUid;
	uint64_t *correlationData;
	uint32_t correlationId;
} CUpti_CallbackData;

typedef void (*CUpti_BuffersCallbackRequestFunc)(uint8_t **buffer, size_t *size,
						 size_t *maxNumRecords);
typedef void (*CUpti_BuffersCallbackCompleteFunc)(CUcontext context, uint32_t streamId,
						  uint8_t *buffer, size_t size, size_t validSize);
typedef void (*CUpti_CallbackFunc)(void *userdata, CUpti_CallbackDomain domain,
				   CUpti_CallbackId cbid, const void *cbdata);

struct fake_subscriber {
	CUpti_CallbackFunc callback;
	void *userdata;
	int driver_launch, runtime_launch;
};

#define MAX_PENDING 4096
static struct fake_subscriber the_subscriber;
static int subscribed;
static CUpti_BuffersCallbackRequestFunc request_cb;
static CUpti_BuffersCallbackCompleteFunc complete_cb;
static int enabled_kinds[32];
static uint8_t *buffer;
static size_t buffer_size, buffer_used;
static size_t dropped;
static uint32_t next_correlation = 1;
static uint64_t clock_offset;
static struct {
	uint32_t correlation, device, stream;
	uint64_t start;
	char *name;
} pending[MAX_PENDING];
static int n_pending;

static int flag(const char *name)
{
	const char *value = getenv(name);
	return value && *value && strcmp(value, "0") != 0;
}

static int kind_incompatible(CUpti_ActivityKind kind)
{
	const char *list = getenv("FAKE_CUPTI_INCOMPATIBLE");
	char *end;

	while (list && *list) {
		if (strtoul(list, &end, 10) == kind)
			return 1;
		list = *end ? end + 1 : end;
	}
	return 0;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + clock_offset;
}

CUptiResult cuptiGetVersion(uint32_t *version)
{
	const char *value = getenv("FAKE_CUPTI_API_VERSION");

	if (!version)
		return CUPTI_ERROR_INVALID_PARAMETER;
	*version = value ? (uint32_t)strtoul(value, NULL, 10) : 24;
	return CUPTI_SUCCESS;
}

CUptiResult cuptiGetResultString(CUptiResult result, const char **str)
{
	if (!str)
		return CUPTI_ERROR_INVALID_PARAMETER;
	switch (result) {
	case CUPTI_SUCCESS: *str = "CUPTI_SUCCESS"; break;
	case CUPTI_ERROR_INVALID_PARAMETER: *str = "CUPTI_ERROR_INVALID_PARAMETER"; break;
	case CUPTI_ERROR_MAX_LIMIT_REACHED: *str = "CUPTI_ERROR_MAX_LIMIT_REACHED"; break;
	case CUPTI_ERROR_NOT_COMPATIBLE: *str = "CUPTI_ERROR_NOT_COMPATIBLE"; break;
	case CUPTI_ERROR_NOT_INITIALIZED: *str = "CUPTI_ERROR_NOT_INITIALIZED"; break;
	case CUPTI_ERROR_INVALID_KIND: *str = "CUPTI_ERROR_INVALID_KIND"; break;
	case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
		*str = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED";
		break;
	case CUPTI_ERROR_UNKNOWN: *str = "CUPTI_ERROR_UNKNOWN"; break;
	default: return CUPTI_ERROR_INVALID_PARAMETER;
	}
	return CUPTI_SUCCESS;
}

CUptiResult cuptiGetTimestamp(uint64_t *timestamp)
{
	if (flag("FAKE_CUPTI_NOT_INITIALIZED"))
		return CUPTI_ERROR_NOT_INITIALIZED;
	if (!timestamp)
		return CUPTI_ERROR_INVALID_PARAMETER;
	*timestamp = now_ns();
	return CUPTI_SUCCESS;
}

CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback,
			   void *userdata)
{
	if (flag("FAKE_CUPTI_NOT_INITIALIZED"))
		return CUPTI_ERROR_NOT_INITIALIZED;
	if (!subscriber)
		return CUPTI_ERROR_INVALID_PARAMETER;
	if (subscribed || flag("FAKE_CUPTI_BUSY"))
		return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
	memset(&the_subscriber, 0, sizeof(the_subscriber));
	the_subscriber.callback = callback;
	the_subscriber.userdata = userdata;
	subscribed = 1;
	*subscriber = &the_subscriber;
	return CUPTI_SUCCESS;
}

CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle subscriber)
{
	if (subscriber != &the_subscriber || !subscribed)
		return CUPTI_ERROR_INVALID_PARAMETER;
	subscribed = 0;
	return CUPTI_SUCCESS;
}

CUptiResult cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
				CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
{
	if (subscriber != &the_subscriber || !subscribed)
		return CUPTI_ERROR_INVALID_PARAMETER;
	if (domain == CUPTI_CB_DOMAIN_DRIVER_API && cbid < 1000) {
		if (cbid == CBID_DRIVER_cuLaunchKernelEx)
			the_subscriber.driver_launch = enable != 0;
		return CUPTI_SUCCESS;
	}
	if (domain == CUPTI_CB_DOMAIN_RUNTIME_API && cbid < 1000) {
		if (cbid == CBID_RUNTIME_cudaLaunchKernel_v7000)
			the_subscriber.runtime_launch = enable != 0;
		return CUPTI_SUCCESS;
	}
	return CUPTI_ERROR_INVALID_PARAMETER;
}

CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc requested,
					   CUpti_BuffersCallbackCompleteFunc completed)
{
	if (flag("FAKE_CUPTI_NOT_INITIALIZED"))
		return CUPTI_ERROR_NOT_INITIALIZED;
	if (flag("FAKE_CUPTI_BUSY"))
		return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
	if (!requested || !completed)
		return CUPTI_ERROR_INVALID_PARAMETER;
	request_cb = requested;
	complete_cb = completed;
	return CUPTI_SUCCESS;
}

static CUptiResult set_kind(CUpti_ActivityKind kind, int on)
{
	if (flag("FAKE_CUPTI_NOT_INITIALIZED"))
		return CUPTI_ERROR_NOT_INITIALIZED;
	if (kind != KIND_KERNEL && kind != KIND_CONCURRENT_KERNEL)
		return CUPTI_ERROR_INVALID_KIND;
	if (on && kind_incompatible(kind))
		return CUPTI_ERROR_NOT_COMPATIBLE;
	enabled_kinds[kind] = on;
	return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind) { return set_kind(kind, 1); }
CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind) { return set_kind(kind, 0); }

static void hand_back(void)
{
	uint8_t *full = buffer;
	size_t size = buffer_size, used = buffer_used;

	if (!full)
		return;
	buffer = NULL;
	buffer_size = buffer_used = 0;
	complete_cb(NULL, 0, full, size, used);
}

CUptiResult cuptiActivityFlushAll(uint32_t flag_)
{
	(void)flag_;
	if (flag("FAKE_CUPTI_NOT_INITIALIZED"))
		return CUPTI_ERROR_NOT_INITIALIZED;
	if (complete_cb && buffer && buffer_used)
		hand_back();
	return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNextRecord(uint8_t *buf, size_t valid, CUpti_Activity **record)
{
	uint8_t *at;

	if (!buf || !record)
		return CUPTI_ERROR_INVALID_PARAMETER;
	at = *record ? (uint8_t *)*record + sizeof(CUpti_ActivityKernel9) : buf;
	if (at + sizeof(CUpti_ActivityKernel9) > buf + valid)
		return CUPTI_ERROR_MAX_LIMIT_REACHED;
	if (((CUpti_Activity *)at)->kind != KIND_CONCURRENT_KERNEL &&
	    ((CUpti_Activity *)at)->kind != KIND_KERNEL)
		return CUPTI_ERROR_INVALID_KIND;
	*record = (CUpti_Activity *)at;
	return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t streamId,
					      size_t *count)
{
	(void)context;
	(void)streamId;
	if (!count)
		return CUPTI_ERROR_INVALID_PARAMETER;
	*count = dropped;
	dropped = 0;
	return CUPTI_SUCCESS;
}

/* --- what the test drives ---------------------------------------------------------------- */

void fake_cupti_advance_ns(uint64_t ns) { clock_offset += ns; }

/* A kernel launch on `device`/`stream`: the subscriber hears it as cuLaunchKernelEx (driver
 * API, how NCCL launches) or cudaLaunchKernel (runtime API, how PyTorch launches). Returns
 * the correlation id its activity record will carry. */
uint32_t fake_cupti_launch(const char *name, uint32_t device, uint32_t stream, int driver_api)
{
	CUpti_CallbackData data;
	uint32_t correlation = next_correlation++;
	int heard = driver_api ? the_subscriber.driver_launch : the_subscriber.runtime_launch;

	memset(&data, 0, sizeof(data));
	data.functionName = driver_api ? "cuLaunchKernelEx" : "cudaLaunchKernel";
	data.symbolName = name;
	data.correlationId = correlation;
	if (subscribed && heard && the_subscriber.callback) {
		CUpti_CallbackDomain domain =
			driver_api ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API;
		CUpti_CallbackId cbid = driver_api ? CBID_DRIVER_cuLaunchKernelEx
						   : CBID_RUNTIME_cudaLaunchKernel_v7000;
		data.callbackSite = CUPTI_API_ENTER;
		the_subscriber.callback(the_subscriber.userdata, domain, cbid, &data);
		data.callbackSite = CUPTI_API_EXIT;
		the_subscriber.callback(the_subscriber.userdata, domain, cbid, &data);
	}
	if (n_pending < MAX_PENDING) {
		pending[n_pending].correlation = correlation;
		pending[n_pending].device = device;
		pending[n_pending].stream = stream;
		pending[n_pending].start = now_ns();
		pending[n_pending].name = strdup(name);
		n_pending++;
	}
	return correlation;
}

/* The kernel of `correlation` ends `duration_ns` after it started: its record goes into the
 * current buffer (a new one is requested when there is none or it is full). Returns 0, or
 * -1 when no such kernel is pending, -2 when the tracer gave no buffer (record dropped). */
int fake_cupti_finish(uint32_t correlation, uint64_t duration_ns)
{
	CUpti_ActivityKernel9 *record;
	int i;
	size_t max_records = 0;

	for (i = 0; i < n_pending && pending[i].correlation != correlation; i++)
		;
	if (i == n_pending)
		return -1;
	if (!enabled_kinds[KIND_CONCURRENT_KERNEL] && !enabled_kinds[KIND_KERNEL]) {
		free(pending[i].name);
		pending[i] = pending[--n_pending];
		return 0;
	}
	if (buffer && buffer_used + sizeof(*record) > buffer_size)
		hand_back();
	if (!buffer && request_cb) {
		request_cb(&buffer, &buffer_size, &max_records);
		buffer_used = 0;
		if (buffer && ((uintptr_t)buffer % 8 != 0 || buffer_size < sizeof(*record)))
			buffer = NULL; /* CUPTI needs 8-byte aligned buffers that hold a record */
	}
	if (!buffer) {
		dropped++;
		free(pending[i].name);
		pending[i] = pending[--n_pending];
		return -2;
	}
	record = (CUpti_ActivityKernel9 *)(buffer + buffer_used);
	memset(record, 0, sizeof(*record));
	record->kind = enabled_kinds[KIND_CONCURRENT_KERNEL] ? KIND_CONCURRENT_KERNEL : KIND_KERNEL;
	record->start = pending[i].start;
	record->end = pending[i].start + duration_ns;
	record->completed = record->end;
	record->deviceId = pending[i].device;
	record->streamId = pending[i].stream;
	record->correlationId = correlation;
	record->gridX = record->gridY = record->gridZ = 1;
	record->name = pending[i].name; /* kept: valid until the process ends */
	buffer_used += sizeof(*record);
	pending[i] = pending[--n_pending];
	return 0;
}

size_t fake_cupti_kernel_record_size(void) { return sizeof(CUpti_ActivityKernel9); }
size_t fake_cupti_name_offset(void) { return offsetof(CUpti_ActivityKernel9, name); }
