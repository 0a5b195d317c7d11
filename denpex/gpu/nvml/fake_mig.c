/* The fake NVML's MIG devices: a GPU whose scenario sets mig_mode has MIG mode (0 off, 1 on);
 * while it is on, mig_count MIG devices each have their own handle, GPU and compute instance
 * ids, profile (slices and memory) and memory use, read from "mig<slot>_<name>" properties of
 * the GPU. Signatures and struct layouts are nvml.h's (API 12). */
#include <stdio.h>
#include <string.h>

#include "fake.h"

struct gpu_instance {
	int gpu;
	int slot;
};

/* nvmlGpuInstanceInfo_t */
typedef struct {
	struct device *device;
	unsigned int id, profileId;
	unsigned int start, size;
} gpu_instance_info_t;

/* nvmlGpuInstanceProfileInfo_v2_t */
typedef struct {
	unsigned int version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount;
	unsigned int copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
	ull memorySizeMB;
	char name[96];
} gpu_instance_profile_info_v2_t;

#define PROFILE_INFO_V2 (152U | (2U << 24))

static struct gpu_instance instances[MAX_GPUS][MAX_MIG];

static int mig_count(int gpu)
{
	int count = (int)num(gpu, "mig_mode", 0) ? (int)num(gpu, "mig_count", 0) : 0;

	return count > MAX_MIG ? MAX_MIG : count;
}

static ull mig_num(int gpu, int slot, const char *name, ull fallback)
{
	struct device dev = {.index = gpu, .mig = slot};

	return num(gpu, mig_key(&dev, name), fallback);
}

int nvmlDeviceGetMigMode(struct device *dev, unsigned int *current, unsigned int *pending)
{
	GUARD(dev, "nvmlDeviceGetMigMode");
	if (!prop(dev->index, "mig_mode"))
		return ERR_NOT_SUPPORTED; /* a GPU without MIG */
	*current = (unsigned int)num(dev->index, "mig_mode", 0);
	*pending = (unsigned int)num(dev->index, "mig_mode_pending", *current);
	return OK;
}

int nvmlDeviceGetMaxMigDeviceCount(struct device *dev, unsigned int *count)
{
	GUARD(dev, "nvmlDeviceGetMaxMigDeviceCount");
	if (!prop(dev->index, "mig_mode"))
		return ERR_NOT_SUPPORTED;
	*count = MAX_MIG;
	return OK;
}

int nvmlDeviceGetMigDeviceHandleByIndex(struct device *dev, unsigned int index,
					struct device **out)
{
	GUARD(dev, "nvmlDeviceGetMigDeviceHandleByIndex");
	if (!out || index >= MAX_MIG)
		return ERR_INVALID_ARGUMENT;
	if ((int)index >= mig_count(dev->index))
		return ERR_NOT_FOUND;
	*out = &mig_devices[dev->index][index];
	return OK;
}

static int instance_id(struct device *dev, const char *fn, const char *name, unsigned int *id)
{
	GUARD(dev, fn);
	if (dev->mig < 0)
		return ERR_NOT_SUPPORTED; /* only MIG device handles have one */
	*id = (unsigned int)mig_num(dev->index, dev->mig, name, 0);
	return OK;
}

int nvmlDeviceGetGpuInstanceId(struct device *dev, unsigned int *id)
{
	return instance_id(dev, "nvmlDeviceGetGpuInstanceId", "gi", id);
}

int nvmlDeviceGetComputeInstanceId(struct device *dev, unsigned int *id)
{
	return instance_id(dev, "nvmlDeviceGetComputeInstanceId", "ci", id);
}

int nvmlDeviceGetGpuInstanceById(struct device *dev, unsigned int id, struct gpu_instance **out)
{
	GUARD(dev, "nvmlDeviceGetGpuInstanceById");
	for (int slot = 0; slot < mig_count(dev->index); slot++)
		if (mig_num(dev->index, slot, "gi", 0) == id) {
			instances[dev->index][slot] = (struct gpu_instance){dev->index, slot};
			*out = &instances[dev->index][slot];
			return OK;
		}
	return ERR_NOT_FOUND;
}

int nvmlGpuInstanceGetInfo(struct gpu_instance *gi, gpu_instance_info_t *info)
{
	if (!initialised)
		return ERR_UNINITIALIZED;
	if (!gi || !info || gi->gpu < 0 || gi->gpu >= gpu_count())
		return ERR_INVALID_ARGUMENT;
	memset(info, 0, sizeof(*info));
	info->device = &devices[gi->gpu];
	info->id = (unsigned int)mig_num(gi->gpu, gi->slot, "gi", 0);
	info->profileId = (unsigned int)mig_num(gi->gpu, gi->slot, "profile_id", 0);
	info->start = (unsigned int)gi->slot;
	info->size = (unsigned int)mig_num(gi->gpu, gi->slot, "slices", 1);
	return OK;
}

int nvmlDeviceGetGpuInstanceProfileInfoByIdV(struct device *dev, unsigned int profile_id,
					     gpu_instance_profile_info_v2_t *info)
{
	GUARD(dev, "nvmlDeviceGetGpuInstanceProfileInfoByIdV");
	if (!info)
		return ERR_INVALID_ARGUMENT;
	if (info->version != PROFILE_INFO_V2)
		return ERR_ARGUMENT_VERSION_MISMATCH;
	for (int slot = 0; slot < mig_count(dev->index); slot++) {
		ull slices = mig_num(dev->index, slot, "slices", 1);
		ull memory_mb = mig_num(dev->index, slot, "memory_total_mib", 0);

		if (mig_num(dev->index, slot, "profile_id", 0) != profile_id)
			continue;
		memset((char *)info + sizeof(info->version), 0, sizeof(*info) - sizeof(info->version));
		info->id = profile_id;
		info->sliceCount = (unsigned int)slices;
		info->instanceCount = 7 / (unsigned int)(slices ? slices : 1);
		info->memorySizeMB = memory_mb;
		snprintf(info->name, sizeof(info->name), "MIG %llug.%llugb", slices,
			 (memory_mb + 1023) / 1024);
		return OK;
	}
	return ERR_INVALID_ARGUMENT;
}
