"""Prefix parsing of real log formats into rank/host/time/source (DESIGN §4)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from denpex.core.events import format_ts
from denpex.lite.prefixes import hints_from_path, parse_line

YEAR = datetime.now(UTC).year  # glog and syslog lines carry no year: the current one is assumed
CASES = [
    # line, source, host, rank, time, body
    (
        b"[rank3]: Traceback (most recent call last):",
        "log",
        None,
        3,
        None,
        b"Traceback (most recent call last):",
    ),
    (b"[default12]:RuntimeError: boom", "log", None, 12, None, b"RuntimeError: boom"),
    (b"3: RuntimeError: boom", "log", None, 3, None, b"RuntimeError: boom"),
    (b"node7: [rank3]: x", "log", "node7", 3, None, b"x"),
    (b"gpu-a100-03.cluster.local: 5: y", "log", "gpu-a100-03.cluster.local", 5, None, b"y"),
    (
        b"[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79",
        "kmsg",
        None,
        None,
        None,
        b"NVRM: Xid (PCI:0000:3b:00): 79",
    ),
    (
        b"[Mon Nov 30 04:56:09 2026] NVRM: Xid",
        "kmsg",
        None,
        None,
        "2026-11-30T04:56:09.000Z",
        b"NVRM: Xid",
    ),
    (b"3,1234,5678901234,-;NVRM: Xid (PCI", "kmsg", None, None, None, b"NVRM: Xid (PCI"),
    (
        b'{"__REALTIME_TIMESTAMP":"1796014569123456","_HOSTNAME":"node7","SYSLOG_IDENTIFIER":"kernel","MESSAGE":"NVRM: Xid"}',
        "kmsg",
        "node7",
        None,
        "2026-11-30T04:56:09.123Z",
        b"NVRM: Xid",
    ),
    (
        b'{"__REALTIME_TIMESTAMP":"1796014569123456","_HOSTNAME":"n1","SYSLOG_IDENTIFIER":"slurmd","MESSAGE":[104,105]}',
        "journal",
        "n1",
        None,
        "2026-11-30T04:56:09.123Z",
        b"hi",
    ),
    (
        b"2026-11-30 04:56:09,123 - INFO - step 10",
        "log",
        None,
        None,
        "2026-11-30T04:56:09.123Z",
        b"INFO - step 10",
    ),
    (
        b"[2026-11-30T04:56:09.250] error: x",
        "log",
        None,
        None,
        "2026-11-30T04:56:09.250Z",
        b"error: x",
    ),
    (
        b"2026-11-30T06:56:09.5+02:00 node7 kernel: oom-kill:x",
        "kmsg",
        "node7",
        None,
        "2026-11-30T04:56:09.500Z",
        b"oom-kill:x",
    ),
    (b"RuntimeError: CUDA error", "log", None, None, None, b"RuntimeError: CUDA error"),
    (b"[pod/llm-worker-3/trainer] [rank24]: x", "log", "llm-worker-3", 24, None, b"x"),
    (b"[1,5]<stderr>:Traceback", "log", None, 5, None, b"Traceback"),
    (b"17: [rank17]: y", "log", None, 17, None, b"y"),
    (
        b"2026-11-04T12:03:02.771+00:00 gpu-f-11 python[44102]: z",
        "syslog",
        "gpu-f-11",
        None,
        "2026-11-04T12:03:02.771Z",
        b"z",
    ),
    (b"ValueError: bad", "log", None, None, None, b"ValueError: bad"),
    (b"step10: loss 3.2", "log", None, None, None, b"step10: loss 3.2"),
    (
        b"node1:12345:12345 [0] NCCL INFO Channel 00",
        "log",
        "node1",
        None,
        None,
        b"node1:12345:12345 [0] NCCL INFO Channel 00",
    ),
    (
        b"[rank1]:[E1130 04:56:09.100000 4100 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog",
        "log",
        None,
        1,
        f"{YEAR}-11-30T04:56:09.100Z",
        b"[Rank 1] Watchdog",
    ),
    (
        b"I1130 04:56:09.250000  77 tcpstore.cpp:12] ok",
        "log",
        None,
        None,
        f"{YEAR}-11-30T04:56:09.250Z",
        b"ok",
    ),
    (
        b"[E ProcessGroupNCCL.cpp:616] [Rank 6] Watchdog caught",
        "log",
        None,
        6,
        None,
        b"[E ProcessGroupNCCL.cpp:616] [Rank 6] Watchdog caught",
    ),
]


@pytest.mark.parametrize(
    "line,source,host,rank,ts,body", CASES, ids=[c[0][:40].decode("latin-1") for c in CASES]
)
def test_parse_line(line, source, host, rank, ts, body):
    parsed = parse_line(line)
    assert (parsed.source, parsed.host, parsed.rank, format_ts(parsed.ts_ns), parsed.body) == (
        source,
        host,
        rank,
        ts,
        body,
    )


def test_syslog_line_keeps_kernel_uptime_and_host():
    parsed = parse_line(
        b"Nov 30 04:56:09 node7 kernel: [12345.678901] Out of memory: Killed process 4242 (python)"
    )
    assert parsed.source == "kmsg" and parsed.host == "node7"
    assert parsed.attrs["uptime_s"] == pytest.approx(12345.678901)
    assert parsed.body.startswith(b"Out of memory")


def test_kmsg_from_user_space_is_marked():
    assert parse_line(b"12,99,5,-;NVRM: Xid").attrs.get("userspace") is True
    assert "userspace" not in parse_line(b"4,99,5,-;NVRM: Xid").attrs


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_parse_without_error(line):
    parsed = parse_line(line.replace(b"\n", b""))
    assert isinstance(parsed.body, bytes)
    assert len(parsed.body) <= len(line) + 64  # journald JSON may re-encode, never explode


_MONTH_NAMES = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
_month = st.sampled_from([*_MONTH_NAMES, "Foo"])
_two = st.integers(0, 99).map(lambda n: f"{n:02d}")
_year = st.integers(0, 9999).map(lambda n: f"{n:04d}")
_frac = st.integers(0, 999_999_999).map(str)
_clock = st.tuples(_two, _two, _two).map(":".join)
_day = st.integers(0, 99).map(str)
_rest = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b""))
# one near-valid line per prefix parser: the right shape, any field value (day 32, hour 24,
# second 60, Feb 29 of a common year, month 13, offset +99:99), then more prefixes or bytes
_NEAR_VALID = st.one_of(
    st.builds(lambda m, d, c, y: f"[{m} {d} {c} {y}] ", _month, _day, _clock, _year),  # dmesg -T
    st.builds(lambda m, d, c: f"{m} {d} {c} node1 kernel: ", _month, _day, _clock),  # syslog
    st.builds(
        lambda y, a, b, c, f: f"{y}-{a}-{b}T{c}.{f}+99:99 ", _year, _two, _two, _clock, _frac
    ),
    st.builds(lambda y, a, b, c: f"{y}-{a}-{b} {c}Z node1 slurmd[12]: ", _year, _two, _two, _clock),
    st.builds(
        lambda y, a, b, c, f: f"{y}-{a}-{b} {c}.{f}: E x.cc:1] ", _year, _two, _two, _clock, _frac
    ),
    st.builds(
        lambda md, c, f: f"E{md} {c}.{f} 4242 api.py:869] ", st.integers(0, 9999), _clock, _frac
    ),
    st.builds(lambda m, d, c, y: f"Fri {m} {d} {c} {y}[3]<stderr>:", _month, _day, _clock, _year),
    st.builds(lambda n: f"{n},1,2,-;", st.integers(0, 10**6)),  # /dev/kmsg record
    st.just('{"MESSAGE": [256, -1, "x"], "__REALTIME_TIMESTAMP": "9"}'),  # journald JSON
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_NEAR_VALID, min_size=1, max_size=3), _rest, st.integers(1, 9999) | st.none())
def test_near_valid_timestamps_never_raise(prefixes, rest, year):
    """Every prefix parser, fed its own shape with impossible values: a line that cannot be
    timed is still a line (no exception; a time, when given, is a real one)."""
    line = "".join(prefixes).encode() + rest
    parsed = parse_line(line, year)
    assert isinstance(parsed.body, bytes)
    if parsed.ts_ns is not None:
        format_ts(parsed.ts_ns)


def test_impossible_dates_keep_the_line_untimed():
    parsed = parse_line(b"Feb 29 12:00:00 node1 kernel: Out of memory", 2027)
    assert (parsed.source, parsed.host, parsed.ts_ns, parsed.body) == (
        "kmsg",
        "node1",
        None,
        b"Out of memory",
    )
    assert parse_line(b"Feb 29 12:00:00 node1 kernel: x", 2028).ts_ns is not None
    leap = parse_line(b"2026-12-31T23:59:60Z done")
    assert format_ts(leap.ts_ns).startswith("2026-12-31T23:59:59")
    assert parse_line(b"[Mon Nov 32 04:56:09 2026] NVRM: Xid").body == b"NVRM: Xid"


@pytest.mark.parametrize(
    "path,expected",
    [
        ("node7/rank3.log", ("node7", 3)),
        ("logs/run1/rank_12.txt", (None, 12)),
        ("kern.log", (None, None)),
        ("gpu-a100-03/train.log", ("gpu-a100-03", None)),
    ],
)
def test_hints_from_path(path, expected):
    assert hints_from_path(path) == expected


def test_a_prefix_is_told_by_its_first_byte():
    # a small letter starts only a host name or kubectl's pod/, which may stack other prefixes
    pod = parse_line(b"pod/trainer-0/main [rank3]: 2026-11-30T05:00:00Z loss 2.1")
    assert (pod.host, pod.rank, pod.ts_ns is not None, pod.body) == (
        "trainer-0",
        3,
        True,
        b"loss 2.1",
    )
    host = parse_line(b"node7: 3: E0130 12:10:04.010000 90211 x.py:1] boom", 2026)
    assert (host.host, host.rank, host.attrs["log_level"], host.body) == ("node7", 3, "E", b"boom")
    # a space, a brace or a non-ASCII byte first: no prefix at all
    for line in (b" [rank3]: x", b"{'loss': 2.1}", "█ [rank3]: x".encode()):
        parsed = parse_line(line)
        assert (parsed.body, parsed.rank, parsed.host, parsed.ts_ns) == (line, None, None, None)
