"""The /dev/kmsg record parser: real record strings, escapes, dictionary lines, round trips,
the usec → wall-clock mapping, and the sequence tracker that counts lost records."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from denpex.core.kmsg import (
    KmsgRecord,
    SeqTracker,
    escape,
    format_record,
    monotonic_to_wall_offset_ns,
    parse_prefix,
    parse_record,
    unescape,
    wall_ns_from_usec,
)


def test_kernel_record_with_dictionary_lines():
    raw = (
        b"3,1045,52061212,-;pcieport 0000:3a:00.0: AER: Uncorrected (Fatal) error received: "
        b"0000:3b:00.0\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n"
    )
    record = parse_record(raw)
    assert record is not None
    assert (record.facility, record.level, record.seq, record.usec) == (0, 3, 1045, 52061212)
    assert record.flags == "-" and not record.user_space
    assert record.message.startswith("pcieport 0000:3a:00.0: AER: Uncorrected (Fatal)")
    assert record.fields == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:3b:00.0"}


def test_user_space_record_and_continuation_flag():
    record = parse_record(b"12,3324,7472386805,c;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234\n")
    assert record is not None
    assert record.facility == 1 and record.level == 4 and record.user_space
    assert record.flags == "c"
    assert record.message == "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234"


def test_extra_prefix_fields_such_as_caller_are_tolerated():
    record = parse_record(b"6,99,1000,-,caller=T1234;hello\n")
    assert record is not None and record.flags == "-" and record.message == "hello"


def test_escapes_are_decoded_in_message_and_values():
    raw = b"4,7,8,-;path C:\\x5cdir tab\\x09end \\xe2\\x9c\\x93\n DEVICE=+x\\x3dy\n"
    record = parse_record(raw)
    assert record is not None
    assert record.message == "path C:\\dir tab\tend \u2713"
    assert record.fields == {"DEVICE": "+x=y"}


def test_not_a_record():
    for raw in (b"", b"hello", b"[ 12.3] x", b"a,b,c,-;x", b"1,2,3,-x"):
        assert parse_record(raw) is None
        assert parse_prefix(raw) is None


def test_prefix_gives_message_offset():
    prefix = parse_prefix(b"6,10,20,-;msg")
    assert prefix is not None and prefix.prio == 6 and prefix.message_start == len(b"6,10,20,-;")


_messages = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)
_fields = st.dictionaries(
    st.from_regex(r"[A-Z][A-Z_]{0,15}", fullmatch=True), _messages, max_size=4
)


@settings(max_examples=300, deadline=None)
@given(
    facility=st.integers(0, 23),
    level=st.integers(0, 7),
    seq=st.integers(0, 2**63),
    usec=st.integers(0, 2**63),
    flags=st.sampled_from(["-", "c"]),
    message=_messages,
    fields=_fields,
)
def test_round_trip(facility, level, seq, usec, flags, message, fields):
    record = KmsgRecord(facility, level, seq, usec, flags, message, fields)
    raw = format_record(record)
    assert raw.count(b"\n") == 1 + len(fields)  # escaping keeps one line per part
    assert parse_record(raw) == record


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_escape_round_trip_and_never_raises(data):
    assert unescape(escape(data)) == data
    parse_record(data)  # arbitrary bytes: a record or None, never an exception


def test_wall_time_mapping():
    assert wall_ns_from_usec(5, offset_ns=1_000) == 6_000
    # a record stamped "now" on CLOCK_MONOTONIC maps to that moment on the wall clock, however
    # late the mapping is computed (both clocks advance together); 1 ms covers µs truncation
    before = time.time_ns()
    now_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    after = time.time_ns()
    for mapped in (
        wall_ns_from_usec(now_usec),
        wall_ns_from_usec(now_usec, monotonic_to_wall_offset_ns()),
    ):
        assert before - 1_000_000 <= mapped <= after + 1_000_000


def test_seq_tracker_counts_gaps_and_skips_repeats():
    tracker = SeqTracker()
    assert tracker.accept(100)  # the first record sets the position, nothing lost
    assert tracker.accept(101) and tracker.lost == 0
    assert tracker.accept(105) and tracker.lost == 3  # 102..104 were overwritten
    assert not tracker.accept(105) and not tracker.accept(50)  # already delivered
    assert tracker.last == 105 and tracker.lost == 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10_000), max_size=50))
def test_seq_tracker_accounts_for_every_number(seqs):
    tracker = SeqTracker(last=None)
    accepted = [s for s in seqs if tracker.accept(s)]
    assert accepted == sorted(set(accepted))
    if accepted:
        span = accepted[-1] - accepted[0] + 1
        assert tracker.lost == span - len(accepted)
