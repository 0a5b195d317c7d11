/* Shared between pagefault.bpf.c and user space (mirrored by denpex/host/ebpf/layouts.py). */
#ifndef DENPEX_PAGEFAULT_H
#define DENPEX_PAGEFAULT_H

/* Per watched tgid, cumulative (user space takes deltas). */
struct pagefault_counts {
	__u64 user_faults;
};

#endif
