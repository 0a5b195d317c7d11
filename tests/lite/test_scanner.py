"""The scanner on hostile input: \\r progress bars, ANSI colour, invalid UTF-8, huge lines,
chunks split anywhere, gaps; and attribution of evidence to hosts and ranks."""

from __future__ import annotations

import random

from denpex.catalog import load_catalog
from denpex.lite.scanner import LINE_CAP, Scanner, pci_bus_id

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
    assert categories(scanner) == ["cuda.oom"]
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
