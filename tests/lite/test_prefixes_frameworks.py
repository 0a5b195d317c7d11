"""Prefixes that JAX/XLA, TensorFlow and Horovod put before a message (TSL C++ logging,
Horovod's logger and horovodrun's rank tags), and the ranks their failure messages name
reaching the evidence."""

from __future__ import annotations

import pytest

from denpex.catalog import load_catalog
from denpex.core.events import format_ts
from denpex.lite.prefixes import parse_line
from denpex.lite.scanner import Scanner

CASES = [
    # line, rank, time, log level, body
    (
        b"2024-07-29 17:14:59.920189: E external/xla/xla/service/rendezvous.cc:38] This thread",
        None,
        "2024-07-29T17:14:59.920Z",
        "E",
        b"This thread",
    ),
    (
        b"[2021-03-01 10:00:00.123456: W /tmp/pip/horovod/common/stall_inspector.cc:107] One or",
        None,
        "2021-03-01T10:00:00.123Z",
        "W",
        b"One or",
    ),
    (b"[3]<stderr>:Traceback (most recent call last):", 3, None, None, b"Traceback (most"),
    (
        b"Fri Sep 25 16:52:53 2020[1]<stderr>:User function raise error",
        1,
        "2020-09-25T16:52:53.000Z",
        None,
        b"User function raise error",
    ),
    (
        b"[0]<stdout>:2024-07-29 17:14:59.920189: W tensorflow/core/framework/op_kernel.cc:1651]"
        b" OP_REQUIRES failed",
        0,
        "2024-07-29T17:14:59.920Z",
        "W",
        b"OP_REQUIRES failed",
    ),
    # an MPI tag is the printing rank; the stall report inside names another one
    (b"[1,0]<stderr>:3!: [allreduce.fc1.weight]", 0, None, None, b"3!: [allreduce.fc1.weight]"),
]


@pytest.mark.parametrize("line,rank,ts,level,body", CASES)
def test_framework_prefixes(line, rank, ts, level, body):
    parsed = parse_line(line)
    assert parsed.rank == rank
    assert (format_ts(parsed.ts_ns) if parsed.ts_ns is not None else None) == ts
    assert parsed.attrs.get("log_level") == level
    assert parsed.body.startswith(body)


def test_not_a_prefix():
    for line in (b"[3] <stderr>: x", b"2024-07-29 17:14:59: E x] y", b"[12345678]<stdout>:x"):
        parsed = parse_line(line)
        assert parsed.rank is None and parsed.ts_ns is None


def evidence_of(text: bytes) -> list[tuple[str, int | None, str | None]]:
    scanner = Scanner(load_catalog())
    scanner.feed("job.log", text)
    scanner.close_all()
    return [(e.category, e.event.rank, e.event.host) for e in scanner.evidence]


def test_the_rank_a_message_names_is_the_evidence_rank():
    log = (
        b"[1,0]<stderr>:[2024-03-01 10:15:22.401231: W /opt/horovod/horovod/common/"
        b"stall_inspector.cc:107] One or more tensors were submitted to be reduced, gathered or"
        b" broadcasted by subset of ranks and are waiting for remainder of ranks for more than 60"
        b" seconds. This may indicate that different ranks are trying to submit different tensors"
        b" or that only subset of ranks is submitting tensors, which will cause deadlock. \n"
        b"[1,0]<stderr>:Missing ranks:\n"
        b"[1,0]<stderr>:2!: [allreduce.fc1.weight, allreduce.fc1.bias]\n"
        b"E0926 17:26:32.075587  157988 coordination_service.cc:1170] /job:jax_worker/replica:0/"
        b"task:0 has been set to ERROR in coordination service: UNAVAILABLE: Task /job:jax_worker/"
        b"replica:0/task:5 heartbeat timeout. This indicates that the remote task has failed, got"
        b" preempted, or crashed unexpectedly.\n"
        b"mpirun noticed that process rank 7 with PID 0 on node gpu-b-04 exited on signal 9"
        b" (Killed).\n"
    )
    found = evidence_of(log)
    assert ("train.hang", 0, None) in found  # the coordinator's own warning
    assert ("train.hang", 2, None) in found  # the rank that stalled
    assert ("dist.peer_failure", 5, None) in found  # the task that stopped heart-beating
    assert ("host.oom_killed", 7, "gpu-b-04") in found


def test_a_horovodrun_rank_tag_attributes_the_line():
    found = evidence_of(
        b"[2]<stderr>:RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81]"
        b" Timed out waiting 1800000ms for recv operation to complete\n"
    )
    assert ("nccl.timeout", 2, None) in found
