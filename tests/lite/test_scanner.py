"""The scanner on hostile input: \\r progress bars, ANSI colour, invalid UTF-8, huge lines,
chunks split anywhere, gaps; and attribution of evidence to hosts and ranks."""

from __future__ import annotations

import random

import pytest

from denpex.catalog import load_catalog
from denpex.lite.scanner import LINE_CAP, Scanner, pci_bus_id

# the matcher, line splitter and ring buffer, compiled and pure Python (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("both_backends")

OOM = b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0"


def scan(*chunks: bytes) -> Scanner:
    scanner = Scanner(load_catalog())
    for chunk in chunks:
        scanner.feed("s", chunk)
    scanner.close_all()
    scanner.apply_stream_defaults()
    return scanner


def categories(scanner: Scanner) -> list[str]:
    return [e.category for e in scanner.evidence]


def test_progress_bars_ansi_and_invalid_utf8():
    data = b"  1%|\r 50%|\r100%|\r\n\x1b[31m[rank3]:" + OOM + b"\x1b[0m \xff\xfe\n"
    scanner = scan(data)
    assert categories(scanner) == ["cuda.oom"]
    evidence = scanner.evidence[0]
    assert evidence.event.rank == 3
    assert "\x1b" not in evidence.event.body and "\ufffd" in evidence.event.body


def test_a_log_pasted_as_a_markdown_quote_reads_as_the_log():
    scanner = scan(b"> epoch 3\n> > [rank2]: " + OOM + b"\n>\n> Killed\n>>> Killed\n")
    # the quoted "Killed" is the shell's report, the ">>> Killed" a Python prompt's echo
    assert [c for c in categories(scanner) if c != "app.exception"] == [
        "cuda.oom",
        "host.oom_killed",
    ]
    oom = next(e for e in scanner.evidence if e.category == "cuda.oom")
    assert (oom.event.rank, oom.event.attrs["line"]) == (2, 2)


def test_any_chunking_gives_the_same_evidence():
    seed = 7
    print("seed", seed)
    rng = random.Random(seed)
    data = (b"step 1\n" * 50 + b"[rank1]:" + OOM + b"\r\n" + b"x" * 1000 + b"\n") * 3
    whole = categories(scan(data))
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(data)), 12))
        pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        assert categories(scan(*pieces)) == whole == ["cuda.oom"] * 3


def test_a_line_beyond_the_cap_is_cut_and_counted():
    scanner = scan(OOM + b"y" * (LINE_CAP * 2) + b"\n")
    # the exception line is also the generic app.exception, as every exception line is
    assert [c for c in categories(scanner) if c != "app.exception"] == ["cuda.oom"]
    assert scanner.truncated_bytes == len(OOM) + LINE_CAP * 2 - LINE_CAP
    assert len(scanner.evidence[0].event.body) <= LINE_CAP


def test_a_gap_drops_the_partial_line_instead_of_gluing_two():
    scanner = Scanner(load_catalog())
    scanner.feed("s", b"torch.OutOfMemoryError: CUDA out")
    scanner.feed("s", b" of memory. Tried to allocate 1 GiB\n", gap=True)
    scanner.close_all()
    assert categories(scanner) == []


def test_xid_is_attributed_to_the_rank_nccl_placed_on_that_gpu():
    data = (
        b"node2:500:600 [5] NCCL INFO comm 0x55 rank 13 nranks 16 cudaDev 5 nvmlDev 5 "
        b"busId ab000 commId 0x1 - Init COMPLETE\n"
        b"[Tue Mar 17 03:41:17 2026] NVRM: Xid (PCI:0000:ab:00): 79, pid=1, GPU has fallen off the bus.\n"
    )
    scanner = scan(data)
    xid = next(e for e in scanner.evidence if e.category == "gpu.fallen_off_bus")
    assert (xid.event.host, xid.event.rank) == ("node2", 13)


def test_ranks_get_hosts_from_the_torchrun_summary():
    data = b"[rank4]:" + OOM + b"\n" + b"  host      : gpu-h-3\n  rank      : 4 (local_rank: 4)\n"
    scanner = scan(data)
    assert scanner.evidence[0].event.host == "gpu-h-3"


def test_pci_bus_id():
    assert pci_bus_id("0000:3b:00") == pci_bus_id("00000000:3B:00.0") == 0x3B000
    assert pci_bus_id("nonsense") is None


def test_a_stream_naming_two_hosts_gives_no_default_host():
    data = (
        b"node1: [rank0]:" + OOM + b"\n"
        b"node2: [rank9]:" + OOM + b"\n"
        b"[Tue Mar 17 03:41:17 2026] NVRM: Xid (PCI:0000:ab:00): 79, pid=1, GPU has fallen off the bus.\n"
    )
    scanner = scan(data)
    xid = next(e for e in scanner.evidence if e.category == "gpu.fallen_off_bus")
    assert xid.event.host is None  # unknown beats wrong: the action would drain that node
    single = scan(b"node1: [rank0]:" + OOM + b"\n[ 12.5] NVRM: Xid (PCI:0000:ab:00): 79, pid=1\n")
    assert {e.event.host for e in single.evidence} == {"node1"}


# -- ranks from processes, never from neighbours (issue: a segfault of rank 0 reported on
# rank 1, an OOM victim in torchrun's table left without a rank) ---------------------------

TORCHRUN_TABLE = b"""torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-03-01_12:21:08
  host      : %s
  rank      : %d (local_rank: %d)
  exitcode  : %d (pid: %d)
  error_file: <N/A>
  traceback : Signal %d (%s) received by PID %d
============================================================
"""


def table(rank: int, code: int, pid: int, host: bytes = b"node4") -> bytes:
    name = {-11: "SIGSEGV", -9: "SIGKILL", -6: "SIGABRT"}[code]
    return TORCHRUN_TABLE % (host, rank, rank, code, pid, -code, name.encode(), pid)


def by_category(scanner: Scanner, category: str) -> list:
    return [e for e in scanner.evidence if e.category == category]


def test_a_launcher_summary_names_the_rank_not_the_neighbouring_lines():
    data = (
        b"[rank1]:[E301 12:21:08.100 ProcessGroupNCCL.cpp:1826] [PG ID 0 PG GUID 0(default_pg)"
        b" Rank 1] Process group watchdog thread terminated with exception: NCCL error: remote"
        b" process exited or there was a network error, NCCL version 2.21.5\n" + table(0, -11, 4242)
    )
    for pieces in ([data], [data[:400], data[400:]]):  # the table split across chunks
        scanner = scan(*pieces)
        segfaults = by_category(scanner, "host.segfault")
        assert segfaults and {e.event.rank for e in segfaults} == {0}
        assert {e.event.host for e in segfaults} == {"node4"}


def test_an_unprefixed_line_takes_no_rank_unless_its_stream_has_one():
    data = b"[rank3]:" + OOM + b"\nSegmentation fault (core dumped)\n"
    scanner = scan(data)
    assert [e.event.rank for e in by_category(scanner, "cuda.oom")] == [3]
    assert all(e.event.rank is None for e in scanner.evidence if e.category != "cuda.oom")
    own = Scanner(load_catalog())
    own.stream("rank5.log", rank=5)
    own.feed("rank5.log", b"Segmentation fault (core dumped)\n")
    own.close_all()
    own.apply_stream_defaults()
    assert own.evidence and {e.event.rank for e in own.evidence} == {5}


def test_the_oom_victim_in_the_kernel_log_gets_the_rank_of_its_pid():
    kernel = (
        b"Nov 30 04:56:09 node7 kernel: [812345.1] oom-kill:constraint=CONSTRAINT_NONE,"
        b"nodemask=(null),cpuset=/,mems_allowed=0-1,global_oom,task=python,pid=42431,uid=1043\n"
        b"Nov 30 04:56:09 node7 kernel: [812345.2] Out of memory: Killed process 42431 (python)"
        b" total-vm:318224812kB, anon-rss:231208844kB, file-rss:0kB, shmem-rss:0kB\n"
    )
    scanner = scan(kernel + table(2, -9, 42431, b"node7"))
    kills = [e for e in by_category(scanner, "host.oom_killed") if e.event.source == "kmsg"]
    assert len(kills) == 2 and {e.event.rank for e in kills} == {2}


def test_note_process_maps_a_pid_the_wrapper_knows():
    scanner = Scanner(load_catalog(), default_host="node1")
    scanner.note_process(5150, rank=3, local_rank=3)
    state = scanner.stream("kmsg", source="kmsg")
    from denpex.lite.prefixes import parse_line

    scanner.add_parsed(
        state,
        parse_line(b"Out of memory: Killed process 5150 (python) total-vm:1kB, anon-rss:1kB"),
    )
    scanner.apply_stream_defaults()
    (kill,) = by_category(scanner, "host.oom_killed")
    assert kill.event.rank == 3 and kill.event.attrs["rank_from_pid"] == 5150


def test_deepspeed_launcher_lines_map_pids_to_local_ranks():
    spawned = b"".join(
        b"[2026-01-01 10:00:0%d,000] [INFO] [launch.py:256:main] process %d spawned with"
        b" command: ['/usr/bin/python', '-u', 'train.py', '--local_rank=%d', '--deepspeed']\n"
        % (i, 700 + i, i)
        for i in range(2)
    )
    killed = b"Out of memory: Killed process 701 (python) total-vm:1kB, anon-rss:1kB\n"
    scanner = scan(spawned + killed)
    assert [e.event.rank for e in by_category(scanner, "host.oom_killed")] == [1]
    # without the spawn lines, `Killing subprocess` comes in local-rank order
    killing = b"".join(
        b"[INFO] [launch.py:319:sigkill_handler] Killing subprocess %d\n" % pid
        for pid in (900, 901, 902)
    )
    scanner = scan(killing + b"Out of memory: Killed process 902 (python) total-vm:1kB\n")
    assert [e.event.rank for e in by_category(scanner, "host.oom_killed")] == [2]


def test_a_local_rank_is_not_taken_for_a_global_rank_on_several_hosts():
    data = (
        b"node1: [rank0]:" + OOM + b"\n"
        b"node2: [rank9]:" + OOM + b"\n"
        b"E0616 00:37:22.901000 4015698 torch/distributed/elastic/multiprocessing/api.py:869]"
        b" failed (exitcode: -11) local_rank: 1 (pid: 4015791) of binary: /usr/bin/python\n"
        b"  traceback : Signal 11 (SIGSEGV) received by PID 4015791\n"
    )
    segfault = by_category(scan(data), "host.segfault")
    assert segfault and segfault[0].event.rank is None
    assert segfault[0].event.attrs["local_rank"] == 1


# -- where each piece of evidence came from ------------------------------------------------


def test_evidence_keeps_file_and_line_number_however_the_input_is_chunked():
    data = (
        b"step 1\n\n 10%|\r 50%|\r100%|\n"  # lines 1-3 (\r rewrites line 3 in place)
        + (b"[rank1]:" + OOM + b"\n")  # line 4
        + (b"x" * 100 + b"\n")  # line 5
        + (b"[rank2]:" + OOM + b"\n")  # line 6
    )
    seed = 11
    print("seed", seed)
    rng = random.Random(seed)
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(data)), 5))
        pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        scanner = scan(*pieces)
        assert [(e.event.attrs["file"], e.event.attrs["line"]) for e in scanner.evidence] == [
            ("s", 4),
            ("s", 6),
        ]


def test_a_live_line_is_timed_by_its_first_byte():
    scanner = Scanner(load_catalog())
    scanner.feed("stdout", b"ok\n[rank0]:" + OOM[:20], arrival_ns=1_000)
    scanner.feed("stdout", OOM[20:] + b"\n[rank1]:" + OOM, arrival_ns=2_000)
    scanner.close("stdout", arrival_ns=9_000)  # the process exited: its last line flushed
    times = [(e.event.rank, e.event.ts_ns) for e in scanner.evidence]
    assert times == [(0, 1_000), (1, 2_000)]
    assert [e.event.attrs["line"] for e in scanner.evidence] == [2, 3]


def test_a_traceback_names_its_innermost_frame():
    data = b"".join(
        b"[rank3]:" + line + b"\n"
        for line in (
            b"Traceback (most recent call last):",
            b'  File "/srv/train.py", line 88, in <module>',
            b"    main()",
            b'  File "/srv/pkg/data.py", line 17, in collate',
            b"    batch = {k: v[key] for k, v in items}",
            b"             ~^^^^^",
            b"KeyError: 'pixel_values'",
        )
    )
    scanner = scan(data)
    errors = [e for e in scanner.evidence if e.is_failure]
    assert errors and errors[0].event.attrs["frame"] == "data.py:17 in collate"


def test_a_dump_signal_from_another_rank_stays_on_the_rank_that_printed_it():
    line = (
        b"[rank1]:[E710 18:00:32.686 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID 0(default_pg)"
        b" Rank 1] Received a dump signal due to a collective timeout from  rank 0 and we will try"
        b" our best to dump the debug info. Last enqueued NCCL work: 4, last completed NCCL work:"
        b" 4.\n"
    )
    (found,) = scan(line).evidence
    assert found.event.rank == 1 and found.captures["from_rank"] == "0"


def test_the_world_size_the_log_states_reaches_the_evidence():
    data = (
        b"INFO:torch.distributed.elastic.agent.server.api:[default] Rendezvous complete\n"
        b"  global_world_sizes=[4, 4, 4, 4]\n"
        b"[rank0]:" + OOM + b"\n"
    )
    (found,) = scan(data).evidence
    assert found.event.attrs["world_size"] == 4
