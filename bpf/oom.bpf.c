// SPDX-License-Identifier: GPL-2.0
/* OOM-killer victims, node-wide: every victim matters, whether or not it is watched.
 * Reads the victim task (not current: the killer may run in another task's context). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "oom.h"

#define PAGE_KB 4 /* x86-64 and arm64 with 4k pages: the kernel's own report assumes the same */

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} victims SEC(".maps");

/* percpu_counter rss_stat (6.2+): .count is the global sum, off by at most the batch */
static __always_inline __u64 rss_pages(struct mm_struct *mm, int member)
{
	__s64 pages = BPF_CORE_READ(mm, rss_stat[member].count);

	return pages > 0 ? (__u64)pages : 0;
}

SEC("tp_btf/mark_victim")
int BPF_PROG(on_mark_victim, struct task_struct *task, uid_t uid)
{
	struct oom_victim_event *e;
	struct mm_struct *mm;
	int memcg = bpf_core_enum_value(enum cgroup_subsys_id, memory_cgrp_id);

	e = bpf_ringbuf_reserve(&victims, sizeof(*e), 0);
	if (!e)
		return 0;
	__builtin_memset(e, 0, sizeof(*e));
	e->ts_ns = bpf_ktime_get_ns();
	e->pid = BPF_CORE_READ(task, pid);
	e->tgid = BPF_CORE_READ(task, tgid);
	e->uid = uid;
	e->oom_score_adj = BPF_CORE_READ(task, signal, oom_score_adj);
	BPF_CORE_READ_STR_INTO(&e->comm, task, comm);
	if (memcg >= 0 && memcg < CGROUP_SUBSYS_COUNT)
		e->memcg_ino = BPF_CORE_READ(task, cgroups, subsys[memcg], cgroup, kn, id);
	e->cgroup2_ino = BPF_CORE_READ(task, cgroups, dfl_cgrp, kn, id);
	mm = BPF_CORE_READ(task, mm);
	if (mm) {
		e->total_vm_kb = BPF_CORE_READ(mm, total_vm) * PAGE_KB;
		e->file_rss_kb = rss_pages(mm, MM_FILEPAGES) * PAGE_KB;
		e->anon_rss_kb = rss_pages(mm, MM_ANONPAGES) * PAGE_KB;
		e->shmem_rss_kb = rss_pages(mm, MM_SHMEMPAGES) * PAGE_KB;
	}
	bpf_ringbuf_submit(e, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
