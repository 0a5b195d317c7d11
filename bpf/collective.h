/* Shared between collective.bpf.c and user space (mirrored by denpex/host/ebpf/layouts.py). */
#ifndef DENPEX_COLLECTIVE_H
#define DENPEX_COLLECTIVE_H

/* The host-side call a thread is inside (the outermost one when calls nest). The attach
 * cookie names the function: its index in COLLECTIVE_FUNCTIONS of denpex/host/ebpf/collector.py. */
struct collective_call {
	__u64 start_ns; /* bpf_ktime_get_ns() at entry: CLOCK_MONOTONIC */
	__u32 tgid;
	__u32 fn;
	__u32 depth;
	__u32 pad;
};

#endif
