"""Prefix stripping: the compiled strip_prefixes gives exactly what its regex twin gives, on every
line of the log corpora and of the benchmarks' corpus, on hypothesis lines stacking the
grammar's prefixes in any order (launchers' ranks, hosts, dmesg, syslog, ISO, glog, c10, tsl,
NCCL) with real and impossible dates and offsets, cut and spliced, on random bytes and invalid
UTF-8, from every state parse_line starts it in; and its C scan, not the twin, reads every line
(`fallbacks`)."""

from __future__ import annotations

from datetime import UTC, datetime
from types import ModuleType

import pytest
from hypothesis import example, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from denpex._native import prefixes_ref
from tests.native.native_support import bench_lines, corpus_lines, native_module

HYPOTHESIS_SEED = 20261203
# (ts_ns, host, rank, pid, source): a plain line, a kmsg record, journal records (a falsy host
# or pid is replaced by NCCL's), and states parse_line never passes, read alike all the same
STATES = [
    (None, None, None, None, "log"),
    (None, None, None, None, "kmsg"),
    (1_796_014_569_123_456_000, "node7", None, 4242, "journal"),
    (None, "", None, 0, "journal"),
    (None, None, 3, None, "log"),
    (0, None, None, None, "syslog"),
]
YEARS = [2026, None, 0, 2024, -1, 10_000, 10**30]


@pytest.fixture(scope="module")
def native() -> ModuleType:
    return native_module("prefixes")


def comparable(result):
    """The result with each field's type (True and 1, 0.0 and 0 differ)."""
    return tuple((type(v).__name__, v) for v in result)


def strip_both(native, line: bytes, year, state=STATES[0]):
    before = native.fallbacks
    expected = prefixes_ref.strip_prefixes(line, year, *state)
    got = native.strip_prefixes(line, year, *state)
    assert comparable(got) == comparable(expected), (line, year, state)
    assert native.fallbacks == before, line
    return expected


def test_the_corpora_strip_the_same_and_in_c(native):
    lines = corpus_lines() + bench_lines()
    before = native.fallbacks
    stripped = 0
    for line in lines:
        for year in (2026, None):
            stripped += strip_both(native, line, year)[0] > 0
        for state in STATES[1:]:
            strip_both(native, line, 2026, state)
    assert stripped > 10_000  # the corpora do carry prefixes
    assert native.fallbacks == before  # every line read in C


TRICKY = [
    b"",
    b"[",
    b"\n",
    b"2026-11-30T04:56:09\n",  # `$` before a final newline
    b"2026-11-30T04:56:09\n\n",
    b"2026-11-30T04:56:09]\n",
    b"[2026-11-30 04:56:09.123456789Z] x",
    b"2026-11-30T04:56:09.1234567890 x",
    b"2026-11-30T04:56:09. x",
    b"2026-11-30T04:56:09,5+05:30 x",
    b"2026-11-30T04:56:09+0530] x",
    b"2026-11-30T04:56:09+05:3 x",
    b"2026-11-30T04:56:09Zx",
    b"2026-11-30T04:56:09 - - name - x",
    b"2026-11-30T04:56:09Z host1 kernel: [ 12.5] x",
    b"2026-11-30T04:56:09Z host1 sshd[0]: gpu1:7:8 [2] x",
    b"2026-11-30T04:56:09Z Host1 slurmd: x",
    b"2026-11-30T04:56:09Z " + b"h" * 63 + b" slurmd: x",
    b"2026-11-30T04:56:09Z " + b"h" * 64 + b" slurmd: x",
    b"2026-11-30T04:56:09Z h " + b"t" * 48 + b"[1]: x",
    b"2026-11-30T04:56:09Z h " + b"t" * 49 + b"[1]: x",
    b"2026-11-30T04:56:09Z h app[12345678901]: x",
    b"[  12.345678] x",
    b"[             1.5] x",
    b"[            1.5] x",
    b"[12345678901.5] x",
    b"[1.1234567890] x",
    b"[Mon Nov 30 04:56:09 2026] x",
    b"[Nov 30 04:56:09 2026]x",
    b"[Nov Mon 30 04:56:09 2026] x",
    b"[Mon Nov  3 04:56:09 2026] x",
    b"[Mon Nov   3 04:56:09 2026] x",
    b"Nov 30 04:56:09 node7 kernel: [ 12.5] x",
    b"Nov 30 04:56:09 node7 sshd[12]:x",
    b"Nov 30 04:56:09 node7 sshd[]: x",
    b"Nov 30 04:56:09 node7 a/b.c-d_e: x",
    b"Foo 30 04:56:09 node7 sshd: x",
    b"Feb 29 04:56:09 node7 sshd: x",
    b"E0130 12:10:04.010000 90211 x.py:1] x",
    b"E0130 12:10:04.010000 123] x",
    b"E0130 12:10:04.010000        9 x.py:1] x",
    b"E0130 12:10:04.010000         9 x.py:1] x",
    b"E0130 12:10:04.010000 12345678901 x.py:1] x",
    b"E0130 12:10:04.0100001234 x.py:1] x",
    b"[E914 13:34:42.100231874 File.cpp:616] x",
    b"[E1301 13:34:42.1 f] x",
    b"[E0229 13:34:42.1 f] x",
    b"I0130 12:10:04.010000 90211 " + b"f" * 200 + b"] x",
    b"I0130 12:10:04.010000 90211 " + b"f" * 201 + b"] x",
    b"2024-07-29 17:14:59.920189: E rendezvous.cc:38] x",
    b"[2024-07-29 17:14:59.920189: W stall_inspector.cc:107] x",
    b"2024-07-29 17:14:59.920189: X a.cc:1] x",
    b"2024-02-30 17:14:59.920189: E a.cc:1] 2024-07-29 17:14:59.1: I b.cc:2] x",
    b"[rank3]: [default1]: [rank11]:x",
    b"[default1]: [rank1234567]: x",
    b"[trainer2]:[worker3]: x",
    b"3: 4: x",
    b"1234567: x",
    b"3:x",
    b"[1,3]<stdout>: [2]<stderr>:x",
    b"[1,3]<stddiag>:x",
    b"[2]<stddiag>: x",
    b"Fri Sep 25 16:52:53 2020[1]<stderr>: x",
    b"Fri Foo 25 16:52:53 2020[1]<stderr>: x",
    b"Fri Sep 31 16:52:53 2020[1]<stderr>: x",
    b"pod/x-1/c [pod/y] x",
    b"[pod/x.y/c-1] x",
    b"pod/x/c.d x",
    b"pod/" + b"a" * 253 + b" x",
    b"pod/" + b"a" * 254 + b" x",
    b"pod/a/" + b"c" * 63 + b" x",
    b"pod/a/" + b"c" * 64 + b" x",
    b"node7: [rank3]: x",
    b"node-a: [rank3]: x",
    b"node-a: [default3]: x",
    b"node-a: 12: x",
    b"node-a: 2026-11-30 x",
    b"node-a: gpu1:12:34 [0] x",
    b"node-a: gpu1:12:34 x",
    b"node-a: x",
    b"a" + b"b" * 40 + b"1: x",
    b"a" + b"b" * 41 + b"1: x",
    b"a1" + b"b" * 20 + b": x",
    b"a1" + b"b" * 21 + b": x",
    b"a" + b"b" * 62 + b": [rank1]: x",
    b"a" + b"b" * 63 + b": [rank1]: x",
    b"n1.a.b.c.d.e.f: x",
    b"n1.a.b.c.d.e.f.g: x",
    b"n1..a: x",
    b"n1." + b"l" * 63 + b": x",
    b"n1." + b"l" * 64 + b": x",
    b"rank3: x",
    b"rank_3: [rank1]: x",
    b"node_rank3: x",
    b"iteration-2: x",
    b"logs3: x",
    b"v2: x",
    b"vx2: x",
    b"ckpt: 3: x",
    b"gpu1:12:34 [0] NCCL INFO x",
    b"gpu1:12:34 [1000] x",
    b"_gpu:1:2 [0] x",
    b"x [Rank 5] y [Rank 6]",
    b"[Rank [Rank 1234567] [Rank 12]",
    b"[Rank 1]",
    "2026-11-30T04:56:09Z █ [Rank 2]".encode(),
    b"\xff\xfe[rank1]: x",
    b"[rank1]: \xc3(",
    b"node1: \xe2\x94 x",
]


@pytest.mark.parametrize("line", TRICKY, ids=range(len(TRICKY)))
def test_tricky_lines_strip_the_same(native, line):
    for year in YEARS:
        for state in STATES:
            strip_both(native, line, year, state)


def iso(year: int, month: int, day: int, hh: int, mm: int, ss: int, tail: str = "") -> bytes:
    return f"{year:04d}-{month:02d}-{day:02d}T{hh:02d}:{mm:02d}:{ss:02d}{tail} x".encode()


OFFSETS = [
    "", "Z", "+00:00", "-00:00", "+0000", "-0000", "+24:00", "-2400", "+23:59", "-23:59", "+2359",
    "+23:60", "-0060", "+12:00", "-12:00", "+05:30", "+0530", "+99:99", "+5:30", "+05:3", "-1",
]  # fmt: skip


def test_times_are_what_datetime_says(native):
    """Every offset form against strptime's %z, the calendar's edges, the years 1-9999 (past
    2262 the ns outgrow 64 bits)."""
    lines = [iso(2026, 11, 30, 4, 56, 9, ".5" + off) for off in OFFSETS]
    for year in (1, 4, 100, 1600, 1677, 1678, 1900, 1969, 1970, 2000, 2023, 2024, 2100, 2262,
                 2263, 2400, 9999):  # fmt: skip
        for month in range(14):
            for day in (0, 1, 28, 29, 30, 31, 32):
                lines.append(iso(year, month, day, 12, 0, 0))
        for hh, mm, ss in ((0, 0, 0), (23, 59, 59), (23, 59, 60), (23, 59, 61), (24, 0, 0),
                           (0, 60, 0), (99, 99, 99)):  # fmt: skip
            lines.append(iso(year, 1, 1, hh, mm, ss, "+23:59"))
            lines.append(iso(year, 12, 31, hh, mm, ss, "-23:59"))
    for month in range(14):
        for day in (0, 1, 29, 30, 31, 32):
            lines.append(f"E{month:02d}{day:02d} 12:10:04.01 9 x.py:1] x".encode())
            lines.append(f"Nov 30 04:56:09 h app: E{month}{day:02d} 12:10:04.01 f] x".encode())
    for line in lines:
        for year in (2024, 2023, 1, 9999, None):
            strip_both(native, line, year)
    assert strip_both(native, iso(2026, 11, 30, 4, 56, 9, "+24:00"), 2026)[1] is None
    assert strip_both(native, iso(2026, 11, 30, 4, 56, 9, "-00:00"), 2026)[1] is not None
    assert strip_both(native, iso(9999, 12, 31, 23, 59, 59, "-23:59"), 2026)[1] > 2**64


def test_a_time_without_a_year_is_in_the_current_one(native):
    for year in (None, 0):
        found = strip_both(native, b"Nov 30 04:56:09 node7 sshd[1]: x", year)
        assert found[1] is not None
        assert datetime.fromtimestamp(found[1] / 1e9, UTC).year == datetime.now(UTC).year


def test_other_bodies_and_years_are_read_by_the_twin(native):
    calls = [
        (bytearray(b"[rank3]: node7: x"), 2026),
        (bytearray(b"2026-11-30T04:56:09Z x"), None),
        (b"Nov 30 04:56:09 node7 sshd[1]: x", True),  # a bool is not the year
    ]
    before = native.fallbacks
    for body, year in calls:
        expected = prefixes_ref.strip_prefixes(body, year, *STATES[0])
        assert comparable(native.strip_prefixes(body, year, *STATES[0])) == comparable(expected)
    assert native.fallbacks - before == len(calls)
    assert prefixes_ref.fallbacks == 0


MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


def shaped(fmt: str, *parts: st.SearchStrategy) -> st.SearchStrategy[str]:
    """`fmt` filled with one draw of each part."""
    return st.tuples(*parts).map(lambda drawn: fmt.format(*drawn))


number = st.integers(0, 10**7)
year = st.one_of(
    st.sampled_from([1, 1969, 1970, 2000, 2023, 2024, 2100, 2262, 2263, 9999]), st.integers(0, 9999)
)
month, day = st.integers(0, 13), st.integers(0, 32)
date = shaped("{:04d}-{:02d}-{:02d}", year, month, day)
clock = shaped("{:02d}:{:02d}:{:02d}", st.integers(0, 25), st.integers(0, 61), st.integers(0, 61))
frac = st.integers(0, 11).flatmap(lambda n: st.text("0123456789", min_size=n, max_size=n))
offset = st.one_of(
    st.sampled_from(OFFSETS), st.from_regex(r"[+-][0-9]{2}:?[0-9]{2}", fullmatch=True)
)
month_name = st.sampled_from([*MONTHS, "Foo", "jan", "JAN", "Mon"])
month_day_clock = shaped("{} {:2d} {}", month_name, day, clock)  # syslog's, dmesg -T's
host = st.one_of(
    st.sampled_from(["node7", "node-a", "login", "gpu-a100-03.cluster.local", "rank3", "step_1",
                     "Node7", "n1.a.b.c.d.e.f.g", "a" * 45 + "1", "v2", "x"]),
    st.from_regex(r"[a-z][a-z0-9-]{0,50}(\.[a-z0-9-]{0,5}){0,3}", fullmatch=True),
)  # fmt: skip
tag = st.sampled_from(["kernel", "slurmd", "slurmstepd", "sshd[12]", "app[0]", "app", "a/b", "x[]"])
bracket = st.sampled_from(["[", ""])
iso_end = st.sampled_from(["] ", " ", "", "]", "\n"])
# one prefix of the grammar, its fields random (dates real or impossible)
prefix = st.one_of(
    shaped("[{}{}]:{}", st.sampled_from(["rank", "default", "trainer", "worker"]), number,
           st.sampled_from(["", " "])),
    shaped("{}: ", number),
    shaped("[{},{}]<{}>: ", number, number, st.sampled_from(["stdout", "stderr", "stddiag"])),
    shaped("[{}]<{}>:", number, st.sampled_from(["stdout", "stderr", "stddiag"])),
    shaped("Fri {} {:04d}[{}]<stdout>: ", month_day_clock, year, number),
    shaped("{}pod/{}{}{}", bracket, host, st.sampled_from(["", "/c", "/c-1", "/c.d"]),
           st.sampled_from(["] ", " ", "]"])),
    shaped("{}: ", host),
    shaped("[{}{}.{}] ", st.integers(0, 14).map(" ".__mul__), number, frac),
    shaped("[{}{} {:04d}] ", st.sampled_from(["Mon ", ""]), month_day_clock, year),
    shaped("{} {} {}: ", month_day_clock, host, tag),
    shaped("{}{}{}{}{}{}{}{}", bracket, date, st.sampled_from("T "), clock,
           st.sampled_from(["", ".", ","]), frac, offset, iso_end),
    shaped("{}T{}Z {} {}: ", date, clock, host, tag),
    shaped("{} {},{} - ", date, clock, frac),
    shaped("{}{:02d}{:02d} {}.{}{}{} x.py:1] ", st.sampled_from("IWEFX"), month, day, clock, frac,
           st.sampled_from(["", " ", " " * 9]), number),
    shaped("[{}{}{:02d} {}.{} File.cpp:616] ", st.sampled_from("IWEF"), month, day, clock, frac),
    shaped("{}{} {}.{}: {} a.cc:38] ", bracket, date, clock, frac, st.sampled_from("TDIWEFX")),
    shaped("{}:{}:{} [{}] ", host, number, number, number),
    shaped("[Rank {}] ", number),
)  # fmt: skip


MESSAGES = [b"msg", b"", b"\n", b"x [Rank 5] y", b"gpu1:1:2 [3] NCCL INFO", b"- name - msg", b" x"]
PIECES = [b" ", b"[", b"]", b":", b"0", b"9", b"-", b".", b"\n", b"\xff", b"\xc3", "█".encode()]
stacked = st.tuples(
    st.lists(prefix, min_size=1, max_size=6).map("".join), st.sampled_from(MESSAGES)
).map(lambda parts: parts[0].encode() + parts[1])


@st.composite
def spliced(draw) -> bytes:
    """Stacked prefixes with bytes put in and parts cut out."""
    line = draw(stacked)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(line)))
        if draw(st.booleans()):
            line = line[:at] + draw(st.sampled_from(PIECES)) + line[at:]
        else:
            line = line[:at] + line[at + draw(st.integers(1, 6)) :]
    return line


@hypothesis_seed(HYPOTHESIS_SEED)
@settings(max_examples=4000, deadline=None)
@given(
    line=st.one_of(stacked, stacked, stacked, spliced(), spliced(), st.binary(max_size=120)),
    year=st.sampled_from(YEARS),
    state=st.sampled_from(STATES),
)
@example(line=b"node-a: [rank1]: 2026-11-30 04:56:09,5 - x", year=None, state=STATES[0])
def test_native_equals_reference_on_hypothesis_lines(native, line, year, state):
    print("hypothesis seed", HYPOTHESIS_SEED)
    strip_both(native, line, year, state)
