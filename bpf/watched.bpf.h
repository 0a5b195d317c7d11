/* Kernel side only: the `watched` map (tgid -> 1) that the collector fills from the
 * registered job pids and their descendants each poll, for the programs that measure only
 * watched processes (sched, pagefault). Not shared with user space as a struct, so
 * build.py leaves *.bpf.h out of layouts.json. Include after vmlinux.h and bpf_helpers.h. */
#ifndef DENPEX_WATCHED_BPF_H
#define DENPEX_WATCHED_BPF_H

#define WATCHED_MAX 4096

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, WATCHED_MAX);
	__type(key, __u32); /* tgid */
	__type(value, __u8);
} watched SEC(".maps");

static __always_inline bool is_watched(__u32 tgid)
{
	return bpf_map_lookup_elem(&watched, &tgid) != NULL;
}

#endif
