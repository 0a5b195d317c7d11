// SPDX-License-Identifier: GPL-2.0
/* User page faults counted per watched tgid in a hash map: one lookup per fault for
 * processes that are not watched, one atomic add for those that are. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "pagefault.h"
#include "watched.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); /* tgid */
	__type(value, struct pagefault_counts);
} faults SEC(".maps");

SEC("tp_btf/page_fault_user")
int BPF_PROG(on_page_fault_user, unsigned long address, struct pt_regs *regs,
	     unsigned long error_code)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct pagefault_counts *c;

	if (!is_watched(tgid))
		return 0;
	c = bpf_map_lookup_elem(&faults, &tgid);
	if (!c) {
		struct pagefault_counts zero = {};

		bpf_map_update_elem(&faults, &tgid, &zero, BPF_NOEXIST);
		c = bpf_map_lookup_elem(&faults, &tgid);
		if (!c)
			return 0;
	}
	__sync_fetch_and_add(&c->user_faults, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
