/* Shared between tcpretrans.bpf.c and user space (mirrored by denpex/host/ebpf/layouts.py). */
#ifndef DENPEX_TCPRETRANS_H
#define DENPEX_TCPRETRANS_H

/* One TCP flow as the socket names it; IPv4 addresses use the first 4 bytes. */
struct tcp_flow_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__u16 sport;  /* host byte order */
	__u16 dport;  /* host byte order */
	__u16 family; /* AF_INET or AF_INET6 */
	__u16 pad;
};

/* Cumulative per flow (user space takes deltas between polls). */
struct tcp_flow_stats {
	__u64 retransmits;
	__u64 last_ns; /* bpf_ktime_get_ns() of the latest retransmit */
	__u32 state;   /* TCP state at the latest retransmit (TCP_ESTABLISHED = 1, ...) */
	__u32 pad;
};

#endif
