/* A stand-in libnccl.so.2 for the eBPF uprobe tests: exports the real NCCL entry points
 * the collective program probes. Each "collective" sleeps for `count` milliseconds (the
 * test's way of holding a call in flight) and returns ncclSuccess (0). Never touches a GPU. */
#include <stddef.h>
#include <time.h>

typedef int ncclResult_t;

static void hold_ms(size_t ms)
{
	struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};

	while (nanosleep(&ts, &ts) != 0)
		;
}

ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, int t, int op, void *comm,
			   void *stream)
{
	hold_ms(count);
	return 0;
}

ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, int t, int root, void *comm,
			   void *stream)
{
	hold_ms(count);
	return 0;
}

ncclResult_t ncclReduce(const void *s, void *r, size_t count, int t, int op, int root,
			void *comm, void *stream)
{
	hold_ms(count);
	return 0;
}

ncclResult_t ncclAllGather(const void *s, void *r, size_t count, int t, void *comm, void *stream)
{
	hold_ms(count);
	return 0;
}

ncclResult_t ncclReduceScatter(const void *s, void *r, size_t count, int t, int op, void *comm,
			       void *stream)
{
	hold_ms(count);
	return 0;
}

ncclResult_t ncclSend(const void *s, size_t count, int t, int peer, void *comm, void *stream)
{
	hold_ms(count);
	return 0;
}

ncclResult_t ncclRecv(void *r, size_t count, int t, int peer, void *comm, void *stream)
{
	hold_ms(count);
	return 0;
}

ncclResult_t ncclGroupStart(void)
{
	return 0;
}

/* the real one blocks here when a peer never arrives; the fake never blocks */
ncclResult_t ncclGroupEnd(void)
{
	return 0;
}
