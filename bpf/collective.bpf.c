// SPDX-License-Identifier: GPL-2.0
/* Uprobes on NCCL collectives and CUDA synchronisation calls: entry records when a thread
 * entered, exit clears it, so user space sees how long the oldest call has been blocked.
 * Measures the host-side call only: NCCL enqueues kernels and returns; a hang shows as a
 * blocked ncclGroupEnd, cuStreamSynchronize or cuCtxSynchronize. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "collective.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32); /* tid */
	__type(value, struct collective_call);
} inflight SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(on_call_enter)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct collective_call *c = bpf_map_lookup_elem(&inflight, &tid);

	if (c) {
		__sync_fetch_and_add(&c->depth, 1);
		return 0;
	}
	struct collective_call call = {
		.start_ns = bpf_ktime_get_ns(),
		.tgid = id >> 32,
		.fn = (__u32)bpf_get_attach_cookie(ctx),
		.depth = 1,
	};
	bpf_map_update_elem(&inflight, &tid, &call, BPF_ANY);
	return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(on_call_exit)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct collective_call *c = bpf_map_lookup_elem(&inflight, &tid);

	if (!c)
		return 0;
	if (c->depth > 1) {
		__sync_fetch_and_add(&c->depth, -1);
		return 0;
	}
	bpf_map_delete_elem(&inflight, &tid);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
