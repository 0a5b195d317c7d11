/* Shared between sched.bpf.c and user space (mirrored by denpex/host/ebpf/layouts.py). */
#ifndef DENPEX_SCHED_H
#define DENPEX_SCHED_H

#define DENPEX_COMM_LEN 16

/* Per watched tgid, cumulative since the tgid was first seen (user space takes deltas). */
struct sched_stats {
	__u64 runq_ns_sum;   /* wakeup -> on CPU */
	__u64 runq_count;
	__u64 offcpu_ns_sum; /* switched out -> switched in (sleep + run-queue wait) */
	__u64 offcpu_count;
};

/* Per watched tgid, the largest values since user space last read (and deleted) them. */
struct sched_max {
	__u64 runq_ns_max;
	__u64 offcpu_ns_max;
};

/* One process exit (the last thread of a watched thread group), through the ring buffer. */
struct sched_exit_event {
	__u64 ts_ns; /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__u32 pid;
	__u32 tgid;
	__u32 ppid;
	__s32 exit_code; /* as wait(2) reports it: (code << 8) | signal */
	char comm[DENPEX_COMM_LEN];
};

#endif
