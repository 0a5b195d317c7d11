/* Shared between oom.bpf.c and user space (mirrored by denpex/host/ebpf/layouts.py). */
#ifndef DENPEX_OOM_H
#define DENPEX_OOM_H

#define DENPEX_COMM_LEN 16

/* One OOM-killer victim (node-wide), through the ring buffer. RSS values are in kB and
 * approximate to the per-CPU counter batch (a few hundred kB), as the kernel's own report. */
struct oom_victim_event {
	__u64 ts_ns;        /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__u64 memcg_ino;    /* inode of the victim's memory-controller cgroup folder */
	__u64 cgroup2_ino;  /* inode of the victim's cgroup v2 (unified) folder */
	__u64 total_vm_kb;
	__u64 anon_rss_kb;
	__u64 file_rss_kb;
	__u64 shmem_rss_kb;
	__u32 pid;
	__u32 tgid;
	__u32 uid;
	__s32 oom_score_adj;
	char comm[DENPEX_COMM_LEN];
};

#endif
