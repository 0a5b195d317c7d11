/* What the sources of the fake libnvidia-ml.so.1 share (fake.c: scenario, devices, queries;
 * fake_mig.c: MIG devices; fake_events.c: event sets, field values, fabric info). Return codes
 * and struct layouts are NVML's (nvml.h, API 12); a scenario says when a call answers "no". */
#ifndef DENPEX_FAKE_NVML_H
#define DENPEX_FAKE_NVML_H

#define OK 0
#define ERR_UNINITIALIZED 1
#define ERR_INVALID_ARGUMENT 2
#define ERR_NOT_SUPPORTED 3
#define ERR_NO_PERMISSION 4
#define ERR_NOT_FOUND 6
#define ERR_INSUFFICIENT_SIZE 7
#define ERR_DRIVER_NOT_LOADED 9
#define ERR_TIMEOUT 10
#define ERR_GPU_IS_LOST 15
#define ERR_RESET_REQUIRED 16
#define ERR_ARGUMENT_VERSION_MISMATCH 25
#define ERR_GPU_NOT_FOUND 28
#define ERR_UNKNOWN 999
#define MAX_GPUS 64
#define MAX_MIG 7 /* MIG devices per GPU: at most seven GPU instances */

typedef unsigned long long ull;

/* One scenario line: from second `t` on, `key` of GPU `gpu` (-1: the system) is `value`. */
struct entry {
	double t;
	int gpu;
	char key[96];
	char value[256];
};

/* A GPU (mig < 0) or one of its MIG devices (mig = slot); handles point at these. */
struct device {
	int index;
	int mig;
};

extern struct entry *entries; /* sorted by t */
extern int n_entries;
extern int initialised;
extern struct device devices[MAX_GPUS];
extern struct device mig_devices[MAX_GPUS][MAX_MIG];

double now_s(void);
void sleep_s(double seconds);
const char *prop(int gpu, const char *key);
ull num(int gpu, const char *key, ull fallback);
int gpu_count(void);
void copy_str(char *out, unsigned int size, const char *value);
/* The key of a MIG device's property: "mig<slot>_<name>", read on its parent GPU. */
const char *mig_key(const struct device *dev, const char *name);
/* Every device call starts here: hang, then fail the way the scenario says. */
int guard(struct device *dev, const char *fn);

#define GUARD(dev, fn)                                                                     \
	do {                                                                               \
		int guarded = guard((dev), (fn));                                          \
		if (guarded != OK)                                                         \
			return guarded;                                                    \
	} while (0)

#endif
