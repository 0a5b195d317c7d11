// SPDX-License-Identifier: GPL-2.0
/* TCP retransmits per flow, node-wide, counted in an LRU hash so the map stays bounded.
 * Fires in softirq context: everything comes from the socket, nothing from current. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "tcpretrans.h"

#define AF_INET 2
#define AF_INET6 10

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct tcp_flow_key);
	__type(value, struct tcp_flow_stats);
} flows SEC(".maps");

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(on_retransmit, const struct sock *sk, const struct sk_buff *skb)
{
	struct tcp_flow_key key = {};
	struct tcp_flow_stats *st;

	key.family = BPF_CORE_READ(sk, __sk_common.skc_family);
	key.sport = BPF_CORE_READ(sk, __sk_common.skc_num);
	key.dport = bpf_ntohs(BPF_CORE_READ(sk, __sk_common.skc_dport));
	if (key.family == AF_INET) {
		/* 4 bytes into the 16-byte arrays (READ_INTO would copy sizeof(__u8)) */
		bpf_core_read(&key.saddr, 4, &sk->__sk_common.skc_rcv_saddr);
		bpf_core_read(&key.daddr, 4, &sk->__sk_common.skc_daddr);
	} else if (key.family == AF_INET6) {
		BPF_CORE_READ_INTO(&key.saddr, sk, __sk_common.skc_v6_rcv_saddr.in6_u.u6_addr8);
		BPF_CORE_READ_INTO(&key.daddr, sk, __sk_common.skc_v6_daddr.in6_u.u6_addr8);
	} else {
		return 0;
	}
	st = bpf_map_lookup_elem(&flows, &key);
	if (!st) {
		struct tcp_flow_stats zero = {};

		bpf_map_update_elem(&flows, &key, &zero, BPF_NOEXIST);
		st = bpf_map_lookup_elem(&flows, &key);
		if (!st)
			return 0;
	}
	__sync_fetch_and_add(&st->retransmits, 1);
	st->last_ns = bpf_ktime_get_ns();
	st->state = BPF_CORE_READ(sk, __sk_common.skc_state);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
