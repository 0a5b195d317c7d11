"""Tests for the stderr verdict (denpex.lite.report_text), on diagnosis dicts built by hand.

They assert on content and shape (width, colour), never on the exact wording of every line.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from denpex.lite.report_text import clean_text, display_width, format_bytes, render_text
from tests.lite.report_samples import (
    ELASTIC,
    OOM,
    WATCHDOG,
    entry,
    finished_ok,
    oom_cascade,
    unknown_run,
)

ANSI = re.compile(r"\x1b\[[0-9;]*m")
HOSTILE = (
    "<script>alert('x')</script> \x1b[31mred\x1b[0m \x1b]0;title\x07 nul\x00 bell\x07 "
    "bad\udcff utf8 \u202eevil\u202c wide 中文字符 "
) + "x" * 5000


def diagnosis(**overrides: Any) -> dict[str, Any]:
    """A failed run: OOM on rank 3 of node2, then NCCL watchdog timeouts on other ranks."""
    timeline = [
        entry("e7", "04:56:09.123456", "node2", 3, "cause", "cuda.oom", "[rank3]: " + OOM),
        entry("e12", "05:06:10.002", "node1", 0, "symptom", "nccl.timeout", "[rank0]: " + WATCHDOG),
        entry(
            "e13", "05:06:10.031", "node1", 1, "symptom", "nccl.timeout", "[rank1]: [Rank 1] t/o"
        ),
        entry("e31", None, "node1", None, "symptom", "dist.peer_failure", ELASTIC),
    ]
    summary = (
        "Rank 3 on node2 ran out of GPU memory; the other ranks then waited in an all-reduce "
        "until the NCCL watchdog timed out and torchrun stopped the job."
    )
    return oom_cascade(**({"timeline": timeline, "summary": summary} | overrides))


def ok_diagnosis(observed: int = 0) -> dict[str, Any]:
    return finished_ok("No failure found.", observed=observed)


def unknown_diagnosis() -> dict[str, Any]:
    return unknown_run(rule="no_evidence")


def hostile_diagnosis() -> dict[str, Any]:
    diag = diagnosis()
    diag["timeline"][0]["line"] = HOSTILE
    diag["timeline"][1]["host"] = "a-very-long-hostname-\x1b[1m-of-a-node.cluster.internal"
    diag["summary"] = HOSTILE[:300]
    return diag


ALL = {
    "cascade": diagnosis,
    "ok": lambda: ok_diagnosis(3),
    "unknown": unknown_diagnosis,
    "hostile": hostile_diagnosis,
    "dropped": lambda: diagnosis(
        stats={"bytes": 10, "lines": 1, "matches": 4, "dropped_analysis_bytes": 3_400_000}
    ),
}


def test_failed_run_names_root_cause_and_confidence_first() -> None:
    text = render_text(diagnosis(), color=False)
    lines = text.splitlines()
    assert lines[0] == "denpex: job FAILED (exit 1) — root cause: cuda.oom (confidence 0.91)"
    assert lines[1] == "  CUDA out of memory on rank 3 (node2): tried to allocate 2.00 GiB"
    assert "signature cuda.oom.torch_out_of_memory" in text
    assert "rule first_failing_rank" in text
    assert "Rank 3 on node2 ran out of GPU memory" in text
    assert "timeline (4 of 37 matching lines)" in text
    assert "what to do" in text and "reduce_memory (node2): lower the micro-batch" in text
    assert "37 of 18,250 lines matched (1.2 MB scanned)" in text
    assert text.endswith("\n")


def test_timeline_rows_show_time_host_rank_and_role() -> None:
    rows = [ln for ln in render_text(diagnosis(), color=False).splitlines() if "node" in ln[:40]]
    cause = next(r for r in rows if "CAUSE" in r)
    assert cause.startswith("  04:56:09.123 node2 r3  CAUSE    torch.OutOfMemoryError")
    assert sum("symptom" in r for r in rows) == 3
    no_time = next(r for r in rows if "torch.distributed" in r)
    assert re.match(r"^  --\s+node1\s+symptom  torch\.distributed", no_time)


def test_host_and_rank_columns_are_omitted_when_unknown() -> None:
    diag = diagnosis()
    for item in diag["timeline"]:
        item["host"] = item["rank"] = None
    rows = [ln for ln in render_text(diag, color=False).splitlines() if "CAUSE" in ln]
    assert re.match(r"^  04:56:09\.123  CAUSE    \[rank3\]: torch", rows[0])
    assert "None" not in render_text(diag, color=False)


def test_cause_line_wraps_at_most_three_lines_and_others_are_cut_with_ellipsis() -> None:
    text = render_text(hostile_diagnosis(), color=False, width=80)
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if "CAUSE" in ln)
    assert lines[at + 2].endswith("…") and lines[at + 3].lstrip().startswith(("05:", "--"))
    symptom = next(ln for ln in lines if "symptom" in ln and "Watchdog" in ln)
    assert symptom.endswith("…")


@pytest.mark.parametrize("name", sorted(ALL))
@pytest.mark.parametrize("width", [40, 60, 80, 132])
def test_every_line_fits_the_width_without_colour(name: str, width: int) -> None:
    text = render_text(ALL[name](), color=False, width=width)
    for line in text.splitlines():
        assert display_width(line) <= width, line
        assert len(line) <= width


@pytest.mark.parametrize("name", sorted(ALL))
def test_no_escape_or_control_characters_without_colour(name: str) -> None:
    text = render_text(ALL[name](), color=False)
    assert "\x1b" not in text and "\x9b" not in text
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f\u202e]", text)
    text.encode("utf-8")  # no lone surrogates: stderr can always encode the verdict


@pytest.mark.parametrize("name", sorted(ALL))
def test_colour_adds_ansi_and_changes_nothing_else(name: str) -> None:
    plain = render_text(ALL[name](), color=False)
    coloured = render_text(ALL[name](), color=True)
    assert "\x1b[" in coloured
    assert ANSI.sub("", coloured) == plain


def test_cause_is_red_and_symptoms_dim_with_colour() -> None:
    coloured = render_text(diagnosis(), color=True)
    assert "\x1b[1;31mCAUSE" in coloured
    assert re.search(r"\x1b\[2m[^\x1b]*symptom", coloured)
    assert "\x1b[1;31mFAILED\x1b[0m" in coloured


def test_ok_run_is_one_line_without_warnings() -> None:
    assert render_text(ok_diagnosis(), color=False) == (
        "denpex: job finished OK (exit 0) — no failure found\n"
    )


def test_ok_run_says_how_many_warnings_were_seen() -> None:
    lines = render_text(ok_diagnosis(observed=3), color=False).splitlines()
    assert len(lines) == 2
    assert "3 warnings seen" in lines[1] and "train.loss_spike ×3" in lines[1]


def test_unknown_failure_says_no_signature_matched_and_shows_the_exit() -> None:
    text = render_text(unknown_diagnosis(), color=False, width=200)
    first = text.splitlines()[0]
    assert first == "denpex: job FAILED (exit 137, SIGKILL) — no known signature matched"
    assert "killed by SIGKILL (exit code 137)" in text
    assert "root cause" not in text and "confidence" not in text


def test_failure_without_exit_status_from_a_scan() -> None:
    diag = diagnosis(exit={"code": None, "signal": None})
    assert render_text(diag, color=False).startswith("denpex: FAILED — root cause: cuda.oom")


def test_dropped_analysis_bytes_are_reported_plainly() -> None:
    for diag in (ALL["dropped"](), {**ok_diagnosis(), "stats": ALL["dropped"]()["stats"]}):
        text = " ".join(render_text(diag, color=False, width=200).split())
        assert "analysis skipped 3.4 MB of output because it could not keep up" in text
        assert "the output itself was not affected" in text
    assert "skipped" not in render_text(diagnosis(), color=False)
    stats = {**ALL["dropped"]()["stats"], "relayed_bytes": 340_000_000}
    text = " ".join(render_text({**ok_diagnosis(), "stats": stats}, color=False).split())
    assert "analysis skipped 3.4 MB of output (1.0% of 340.0 MB; it read the rest)" in text


def test_hostile_line_is_cleaned_but_its_text_kept() -> None:
    text = render_text(hostile_diagnosis(), color=False, width=100)
    assert "<script>alert('x')</script> red nul bell bad\ufffd utf8 evil" in text
    assert " a-very-long-h… r0 " in text  # the host column is cut to 14 columns


def test_wide_characters_count_two_columns() -> None:
    diag = diagnosis()
    diag["timeline"][0]["line"] = "错误" * 200
    diag["summary"] = "内存不足" * 60
    for line in render_text(diag, color=False, width=50).splitlines():
        assert display_width(line) <= 50


def test_cleaning_and_formatting() -> None:
    assert clean_text("a\x1b[1;31mb\x1b[0m\tc\x00") == "ab c"
    assert clean_text(None) == ""
    assert format_bytes(0) == "0 B" and format_bytes(999) == "999 B"
    assert format_bytes(1_234_567) == "1.2 MB" and format_bytes(5 * 10**12) == "5.0 TB"


# Text as a log line can hold it: any code point, lone surrogates, escapes, bidi overrides.
ANY_TEXT = st.lists(
    st.one_of(
        st.characters(),
        st.characters(categories=["Cs"]),
        st.sampled_from(
            ["\x1b[31m", "\x9b1m", "\x1b]0;t\x07", "\t", "\u202e", "中", "\u0301", " "]
        ),
    ),
    max_size=300,
).map("".join)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    line=ANY_TEXT,
    host=st.one_of(st.none(), ANY_TEXT),
    summary=ANY_TEXT,
    width=st.integers(min_value=8, max_value=160),
)
def test_any_text_fits_and_never_leaks_escapes(
    line: str, host: str | None, summary: str, width: int
) -> None:
    diag = diagnosis(summary=summary)
    diag["timeline"][0]["line"] = line
    diag["timeline"][1]["host"] = host
    diag["root_cause"]["title"] = line[:120]
    text = render_text(diag, color=False, width=width)
    assert all(display_width(ln) <= width and len(ln) <= width for ln in text.splitlines())
    assert "\x1b" not in text
    text.encode("utf-8")
