// SPDX-License-Identifier: GPL-2.0
/* Run-queue latency and off-CPU time of the threads of watched processes, aggregated in
 * the kernel per tgid (no per-switch event reaches user space), and their exits. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "sched.h"
#include "watched.bpf.h"

#define TASK_RUNNING 0

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);  /* tid */
	__type(value, __u64); /* when it became runnable */
} wakeup_ts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);  /* tid */
	__type(value, __u64); /* when it left the CPU */
} offcpu_ts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);  /* tgid */
	__type(value, struct sched_stats);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);  /* tgid */
	__type(value, struct sched_max);
} maxima SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} exits SEC(".maps");

static __always_inline void mark_runnable(struct task_struct *p)
{
	__u32 tgid = BPF_CORE_READ(p, tgid);
	__u32 tid = BPF_CORE_READ(p, pid);
	__u64 now;

	if (!is_watched(tgid))
		return;
	now = bpf_ktime_get_ns();
	bpf_map_update_elem(&wakeup_ts, &tid, &now, BPF_ANY);
}

static __always_inline struct sched_stats *stats_of(__u32 tgid)
{
	struct sched_stats *s = bpf_map_lookup_elem(&stats, &tgid);

	if (s)
		return s;
	struct sched_stats zero = {};
	bpf_map_update_elem(&stats, &tgid, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&stats, &tgid);
}

static __always_inline struct sched_max *max_of(__u32 tgid)
{
	struct sched_max *m = bpf_map_lookup_elem(&maxima, &tgid);

	if (m)
		return m;
	struct sched_max zero = {};
	bpf_map_update_elem(&maxima, &tgid, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&maxima, &tgid);
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(on_wakeup, struct task_struct *p)
{
	mark_runnable(p);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(on_wakeup_new, struct task_struct *p)
{
	mark_runnable(p);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 tgid = BPF_CORE_READ(prev, tgid);
	__u32 tid = BPF_CORE_READ(prev, pid);

	if (tid && is_watched(tgid)) {
		bpf_map_update_elem(&offcpu_ts, &tid, &now, BPF_ANY);
		/* preempted while runnable: it waits on the run queue from now */
		if (prev_state == TASK_RUNNING)
			bpf_map_update_elem(&wakeup_ts, &tid, &now, BPF_ANY);
	}

	tgid = BPF_CORE_READ(next, tgid);
	tid = BPF_CORE_READ(next, pid);
	if (!tid || !is_watched(tgid))
		return 0;
	struct sched_stats *s = stats_of(tgid);
	struct sched_max *m = max_of(tgid);
	__u64 *ts = bpf_map_lookup_elem(&wakeup_ts, &tid);

	if (ts) {
		__u64 delta = now - *ts;

		bpf_map_delete_elem(&wakeup_ts, &tid);
		if (s) {
			__sync_fetch_and_add(&s->runq_ns_sum, delta);
			__sync_fetch_and_add(&s->runq_count, 1);
		}
		if (m && delta > m->runq_ns_max)
			m->runq_ns_max = delta;
	}
	ts = bpf_map_lookup_elem(&offcpu_ts, &tid);
	if (ts) {
		__u64 delta = now - *ts;

		bpf_map_delete_elem(&offcpu_ts, &tid);
		if (s) {
			__sync_fetch_and_add(&s->offcpu_ns_sum, delta);
			__sync_fetch_and_add(&s->offcpu_count, 1);
		}
		if (m && delta > m->offcpu_ns_max)
			m->offcpu_ns_max = delta;
	}
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p, bool group_dead)
{
	__u32 tgid = BPF_CORE_READ(p, tgid);
	__u32 tid = BPF_CORE_READ(p, pid);
	struct sched_exit_event *e;

	if (!is_watched(tgid))
		return 0;
	bpf_map_delete_elem(&wakeup_ts, &tid);
	bpf_map_delete_elem(&offcpu_ts, &tid);
	if (!group_dead)
		return 0;
	e = bpf_ringbuf_reserve(&exits, sizeof(*e), 0);
	if (!e)
		return 0;
	e->ts_ns = bpf_ktime_get_ns();
	e->pid = tid;
	e->tgid = tgid;
	e->ppid = BPF_CORE_READ(p, real_parent, tgid);
	e->exit_code = BPF_CORE_READ(p, exit_code);
	BPF_CORE_READ_STR_INTO(&e->comm, p, comm);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
