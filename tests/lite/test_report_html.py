"""Tests for the self-contained HTML report (denpex.lite.report_html), on hand-built dicts.

The page must parse with balanced containers, escape every text, and reference nothing
outside itself; the timeline SVG has one lane per host/rank.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import pytest

from denpex.lite.report_html import render_html
from tests.lite.report_samples import (
    ELASTIC,
    OOM,
    WATCHDOG,
    entry,
    finished_ok,
    oom_cascade,
    unknown_run,
    watchdog_symptom,
)

VOID = {"meta", "br", "hr", "img", "input", "link", "wbr", "col", "area", "source"}
# Inside inline SVG these are written self-closing; the parser reports them as start-end tags.
HOSTILE = (
    "<script src=\"https://evil.example/x.js\">alert('x')</script><img src=x onerror=alert(1)>"
    ' \x1b[31mred\x1b[0m nul\x00 bad\udcff \u202eevil "quoted" & amp '
) + "A" * 5000


class PageParser(HTMLParser):
    """Checks that tags balance and collects tags, attributes and text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(page: str) -> PageParser:
    parser = PageParser()
    parser.feed(page)
    parser.close()
    assert parser.errors == [] and parser.stack == [], (parser.errors, parser.stack)
    return parser


def cascade(**overrides: Any) -> dict[str, Any]:
    """OOM on rank 3 of node2, then watchdog timeouts on node1 and torchrun giving up."""
    peer_failure = {
        "category": "dist.peer_failure",
        "signature": "dist.peer_failure.x",
        "role": "symptom",
        "evidence": ["e31", "e99"],
        "host": None,
        "rank": None,
    }
    timeline = [
        entry(
            "e3",
            "04:55:58.410",
            "node2",
            3,
            "related",
            "train.grad_overflow",
            "[rank3]: Gradient overflow",
        ),
        entry("e7", "04:56:09.123", "node2", 3, "cause", "cuda.oom", "[rank3]: " + OOM),
        entry("e12", "05:06:10.002", "node1", 0, "symptom", "nccl.timeout", "[rank0]: " + WATCHDOG),
        entry("e13", "05:06:10.031", "node1", 1, "symptom", "nccl.timeout", "[rank1]: " + WATCHDOG),
        entry("e31", "05:06:14.877", "node1", None, "symptom", "dist.peer_failure", ELASTIC),
    ]
    fields = {
        "contributing": [watchdog_symptom(), peer_failure],
        "timeline": timeline,
        "summary": "Rank 3 on node2 ran out of GPU memory; the other ranks then timed out.",
    }
    return oom_cascade(**(fields | overrides))


def ok_run() -> dict[str, Any]:
    line = entry("e1", "01:00:00", None, None, "observed", "train.loss_spike", "spike")
    return finished_ok("No failure.", observed=2, timeline=[line])


def hostile_run() -> dict[str, Any]:
    diag = cascade()
    diag["timeline"][1]["line"] = HOSTILE
    diag["timeline"][2]["host"] = '"><script>alert(1)</script>'
    diag["summary"] = HOSTILE[:400]
    diag["actions"][0]["reason"] = "<b>see https://example.com/runbook</b>"
    diag["notes"] = ["<i>note</i>"]
    return diag


ALL = {"cascade": cascade, "ok": ok_run, "unknown": unknown_run, "hostile": hostile_run}


@pytest.mark.parametrize("name", sorted(ALL))
def test_page_parses_with_balanced_containers(name: str) -> None:
    page = render_html(ALL[name]())
    parsed = parse(page)
    tags = [tag for tag, _ in parsed.tags]
    assert page.startswith("<!DOCTYPE html>")
    for container in ("html", "head", "body", "main", "header", "footer"):
        assert tags.count(container) == 1, container
    assert page.encode("utf-8")


@pytest.mark.parametrize("name", sorted(ALL))
def test_page_references_nothing_outside_itself(name: str) -> None:
    page = render_html(ALL[name]())
    parsed = parse(page)
    ids = {attrs.get("id") for _, attrs in parsed.tags}
    for tag, attrs in parsed.tags:
        assert tag not in {"script", "img", "link", "iframe", "object", "embed", "image"}
        assert "src" not in attrs and "srcset" not in attrs and "action" not in attrs
        assert not any(name.startswith("on") for name in attrs), attrs
        for key in ("href", "xlink:href"):
            if key in attrs:
                target = attrs[key] or ""
                assert target.startswith("#") and target[1:] in ids, target
    assert "http://" not in page and "https://" not in page
    assert "url(" not in page and "@import" not in page
    if name != "hostile":  # the hostile line carries `src=` as escaped text
        assert "src=" not in page


def test_cascade_verdict_summary_and_actions() -> None:
    parsed = parse(render_html(cascade()))
    text = " ".join("".join(parsed.text).split())
    assert "FAILED cuda.oom" in text
    assert "CUDA out of memory on rank 3 (node2): tried to allocate 2.00 GiB" in text
    assert "0.91" in text and "cuda.oom.torch_out_of_memory" in text
    assert "first_failing_rank" in text and "node2 · rank 3" in text
    assert "Rank 3 on node2 ran out of GPU memory" in text
    assert "reduce_memory node2: lower the micro-batch size" in text
    assert "1.2 MB" in text and "18,250" in text


def test_svg_timeline_has_one_lane_per_host_and_rank() -> None:
    page = render_html(cascade())
    assert page.count("<svg") == 1 and "xmlns" not in page
    lanes = re.findall(r'<g class="lane" data-lane="([^"]*)"', page)
    assert lanes == ["node1 · rank 0", "node1 · rank 1", "node1", "node2 · rank 3"]
    assert "m-cause" in page and "m-symptom" in page and "m-related" in page
    legend = page[page.index("<svg") : page.index('<g class="lane"')]
    assert ">cause<" in legend and ">symptom<" in legend


def marker_x(page: str) -> dict[str, float]:
    found = re.findall(
        r'<a href="#ev-(e\d+)"><title>.*?</title>.*?class="m-[a-z]+" cx="([\d.]+)"', page
    )
    return {eid: float(x) for eid, x in found}


def test_markers_are_placed_by_time_when_timestamps_exist() -> None:
    xs = marker_x(render_html(cascade()))
    assert xs["e3"] < xs["e7"] < xs["e12"] <= xs["e13"] < xs["e31"]  # e12, e13: 29 ms apart
    # e3→e7 is 11 s, e7→e12 is 10 min: the gap on the page follows the clock
    assert (xs["e12"] - xs["e7"]) > 20 * (xs["e7"] - xs["e3"])


def test_markers_are_placed_by_order_without_timestamps() -> None:
    diag = cascade()
    for item in diag["timeline"]:
        item["ts"] = None
    page = render_html(diag)
    xs = marker_x(page)
    steps = [
        xs[b] - xs[a]
        for a, b in zip(["e3", "e7", "e12", "e13"], ["e7", "e12", "e13", "e31"], strict=True)
    ]
    assert all(abs(step - steps[0]) < 0.2 for step in steps) and steps[0] > 0
    assert "in the order seen" in page


def test_an_entry_without_a_time_sits_between_its_neighbours() -> None:
    diag = cascade()
    diag["timeline"][2]["ts"] = None  # e12, between e7 (04:56:09) and e13 (05:06:10)
    xs = marker_x(render_html(diag))
    assert xs["e7"] < xs["e12"] < xs["e13"]


def test_cause_links_to_each_symptom() -> None:
    page = render_html(cascade())
    assert len(re.findall(r'<path class="link" d="M[\d.]+,[\d.]+ C', page)) == 3  # e12, e13, e31


def test_hostile_text_is_escaped_everywhere() -> None:
    page = render_html(hostile_run(), title="<title>x</title>")
    parsed = parse(page)
    assert [t for t, _ in parsed.tags].count("title") == 1 + len(cascade()["timeline"])
    assert "<script" not in page.lower() and "<img" not in page and "<b>" not in page
    assert "&lt;script src=&quot;https&#58;//evil.example/x.js&quot;&gt;" in page
    assert "\x1b" not in page and "\x00" not in page and "\u202e" not in page
    text = "".join(parsed.text)
    assert "<script src=\"https://evil.example/x.js\">alert('x')</script>" in text
    assert "red nul bad\ufffd evil" in text
    assert "<b>see https://example.com/runbook</b>" in text


def test_long_lines_fold_into_details() -> None:
    page = render_html(hostile_run())
    assert "<details><summary>show all 5," in page
    assert page.count("A" * 5000) == 1  # shown whole once, inside the details


def test_evidence_table_has_every_column_and_row() -> None:
    page = render_html(cascade())
    table = page[page.index('<section id="evidence">') :]
    table = table[: table.index("</section>")]
    heads = re.findall(r"<th>([a-z]+)</th>", table)
    assert heads == ["id", "time", "host", "rank", "source", "category", "role", "line"]
    assert table.count("<tr id=") == 5
    assert '<tr id="ev-e7" class="cause">' in table and "04:56:09.123" in table


def test_contributing_links_only_to_evidence_on_the_page() -> None:
    page = render_html(cascade())
    section = page[page.index('<section id="contributing">') :]
    assert '<a href="#ev-e12">e12</a>' in section and '<a href="#ev-e31">e31</a>' in section
    assert "e99" in section and 'href="#ev-e99"' not in section


def test_ok_run() -> None:
    page = render_html(ok_run())
    assert "no failure found" in page and 'class="v-ok"' in page
    assert 'data-lane="host/rank unknown"' in page and "01:00:00.000" in page
    assert "train.loss_spike" in page and "observed" in page


def test_unknown_failure_without_timeline() -> None:
    page = render_html(unknown_run())
    assert "no known signature matched" in page and "137, SIGKILL" in page
    assert "<svg" not in page and "No evidence lines on the timeline." in page
    assert "confidence" not in page


def test_dropped_analysis_bytes_are_reported() -> None:
    stats = {"bytes": 10, "lines": 1, "matches": 0, "dropped_analysis_bytes": 3_400_000}
    page = render_html(cascade(stats=stats))
    assert "Analysis skipped 3.4 MB of output" in page
    assert "output itself was not affected" in page
    assert "Analysis skipped" not in render_html(cascade())
