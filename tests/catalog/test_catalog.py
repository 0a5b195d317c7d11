"""The shipped catalog and its loader: every entry valid, every example agrees with the
matcher, and a broken catalog is reported entirely, each problem with file:line."""

from __future__ import annotations

import textwrap
from collections import Counter

import pytest

from denpex.catalog import Catalog, CatalogError, load_catalog, load_signatures
from denpex.core import load_taxonomy, scan_cues

# the matcher, line splitter and ring buffer, compiled and pure Python (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("both_backends")

GOOD = """\
- id: gpu.fallen_off_bus.test_xid79
  category: gpu.fallen_off_bus
  severity: critical
  sources: [kmsg, log]
  regex: 'NVRM: Xid \\(PCI:(?P<pci>[0-9a-fA-F:.]{1,16})\\): 79\\b'
  summary: "GPU {pci} fell off the bus"
  action: drain_node
  explain: "The GPU dropped off PCIe. Drain the node."
  refs: ["https://docs.nvidia.com/deploy/xid-errors/"]
  examples:
    match: ["NVRM: Xid (PCI:0000:3b:00): 79, pid=1"]
    no_match: ["NVRM: Xid (PCI:0000:3b:00): 13, pid=1"]
"""


def test_builtin_catalog_is_valid_and_its_examples_agree():
    catalog = load_catalog()
    assert len(catalog) >= 60
    assert catalog.example_errors() == []


def test_builtin_catalog_covers_the_frequent_classes():
    per_category = Counter(s.category for s in load_catalog().signatures)
    frequent = [
        "cuda.oom",
        "cuda.illegal_address",
        "cuda.device_assert",
        "nccl.timeout",
        "nccl.system_error",
        "nccl.internal_error",
        "gpu.fallen_off_bus",
        "gpu.ecc_uncorrectable",
        "gpu.row_remap",
        "gpu.nvlink",
        "gpu.gsp_timeout",
        "host.oom_killed",
        "host.disk_full",
        "data.worker_died",
        "host.shm_exhausted",
        "dist.rendezvous_timeout",
        "dist.port_in_use",
        "dist.peer_failure",
        "train.nan_loss",
        "app.exception",
        "host.segfault",
        "job.time_limit",
        "job.preempted",
    ]
    assert [c for c in frequent if per_category[c] == 0] == []
    taxonomy = load_taxonomy()
    assert set(per_category) <= {c.id for c in taxonomy}


@pytest.mark.parametrize(
    "xid,category",
    [
        (79, "gpu.fallen_off_bus"),
        (48, "gpu.ecc_uncorrectable"),
        (63, "gpu.row_remap"),
        (64, "gpu.row_remap"),
        (74, "gpu.nvlink"),
        (119, "gpu.gsp_timeout"),
    ],
)
def test_xid_codes_map_to_their_category(xid, category):
    line = f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=4242, name=python, details".encode()
    found = {m.signature.category for m in load_catalog().match_lines([line])}
    assert category in found
    other = f"NVRM: Xid (PCI:0000:3b:00): {xid}1, pid=4242, name=python".encode()
    assert category not in {m.signature.category for m in load_catalog().match_lines([other])}


def test_a_custom_folder_loads(tmp_path):
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "x.yaml").write_text(GOOD)
    catalog = load_catalog([str(tmp_path)])
    assert [s.id for s in catalog.signatures] == ["gpu.fallen_off_bus.test_xid79"]
    assert catalog.example_errors() == []


def test_every_problem_is_reported_with_file_and_line(tmp_path):
    bad = GOOD + textwrap.dedent("""\
        - id: gpu.bad
          category: gpu.nope
          severity: huge
          regex: '(?P<x>\\S+) a\\sb'
          summary: "{y}"
          action: pray
          explain: ""
          refs: []
          examples: {match: []}
          colour: red
        - id: gpu.fallen_off_bus.test_xid79
          category: gpu.fallen_off_bus
          severity: critical
          regex: 'NVRM: Xid .*79'
          summary: "x"
          action: drain_node
          explain: "x"
          refs: [x]
          examples: {match: ["NVRM: Xid 79"], no_match: ["nothing"]}
    """)
    (tmp_path / "gpu").mkdir()
    path = tmp_path / "gpu" / "bad.yaml"
    path.write_text(bad)
    with pytest.raises(CatalogError) as caught:
        load_signatures([str(tmp_path)])
    errors = caught.value.errors
    text = "\n".join(errors)
    for needle in (
        "unknown key 'colour'",
        "not a taxonomy id",
        "severity must be one of",
        "action 'pray'",
        "'explain' must be a non-empty",
        "refs must be",
        r"uses \s",
        "required literal",
        "summary uses {y}",
        "examples.match",
        "duplicate id",
    ):
        assert needle in text, needle
    assert all(e.startswith("gpu/bad.yaml:") or "bad.yaml:" in e for e in errors)
    lines = {int(e.split(":")[1]) for e in errors}
    assert 14 in lines and 23 in lines  # the category and the unknown key of entry 2


def test_invalid_yaml_is_one_clear_error(tmp_path):
    (tmp_path / "x.yaml").write_text("- id: [unclosed\n")
    with pytest.raises(CatalogError) as caught:
        load_signatures([str(tmp_path)])
    assert "not valid YAML" in caught.value.errors[0]


def test_an_example_that_disagrees_is_caught(tmp_path):
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "x.yaml").write_text(GOOD.replace(": 13, pid=1", ": 79, pid=2"))
    problems = Catalog(load_signatures([str(tmp_path)])).example_errors()
    assert len(problems) == 1 and "counter-example" in problems[0]


def test_full_catalog_check_passes_including_overlaps_and_re2():
    pytest.importorskip("re2")
    from denpex.catalog.check import check

    assert check(None) == []


def test_overlap_between_categories_is_reported(tmp_path):
    from denpex.catalog.check import accepted_overlaps, overlap_problems

    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "x.yaml").write_text(GOOD)
    other = GOOD.replace("gpu.fallen_off_bus", "gpu.reset_required").replace("test_xid79", "t2")
    (tmp_path / "gpu" / "y.yaml").write_text(other)
    catalog = load_catalog([str(tmp_path)])
    assert len(overlap_problems(catalog, accepted_overlaps([str(tmp_path)]))) == 2
    (tmp_path / "overlaps.yaml").write_text(
        "- {id: gpu.fallen_off_bus.test_xid79, also: [gpu.reset_required], why: test}\n"
    )
    assert len(overlap_problems(catalog, accepted_overlaps([str(tmp_path)]))) == 1


def test_library_size_and_coverage():
    """The library target (issue: the signature library): ≥ 400 entries, ≥ 3 per category."""
    per_category = Counter(s.category for s in load_catalog().signatures)
    assert sum(per_category.values()) >= 400
    thin = {
        c.id: per_category[c.id]
        for c in load_taxonomy()
        if c.id != "unknown" and per_category[c.id] < 3
    }
    assert thin == {}


def test_the_scan_cues_are_found_in_the_catalogs_pass_and_reported_apart():
    catalog = load_catalog()
    lines = [
        b"node7:4100:4100 [3] NCCL INFO comm 0x55 rank 3 nranks 16 cudaDev 3 busId 3b000",
        b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        b"step=120 loss=nan lr=3e-4",
        b"exitcode  : -9 (pid: 4100)",
        b"srun: error: node3: task 5: Killed",
        b"NCCL INFO Using network IB",  # INF of INFO: no non-finite value
        b"plain line",
    ]
    joined = b"\n".join(lines)
    matches, cues = catalog.scan_joined(joined)
    assert [(m.line_index, m.signature.id) for m in matches] == [
        (m.line_index, m.signature.id) for m in catalog.match_joined(joined)
    ]
    assert matches and all(m.line_index != 6 for m in matches)
    words = {
        (i, scan_cues.WORDS.index(w)) for i, line in enumerate(lines) for w in scan_cues.WORDS
        if w in line
    }  # fmt: skip
    assert {c for c in cues if c[1] != scan_cues.NONFINITE} == words
    assert {i for i, c in cues if c == scan_cues.NONFINITE} == {2}
    # the cues never reach the signatures' answers
    assert {m.signature.id for m in catalog.match_lines(lines)} == {m.signature.id for m in matches}
