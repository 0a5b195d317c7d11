"""One self-contained HTML page for a `denpex.diagnosis/v1` dict: verdict, timeline, evidence.

A pure function of the dict: the page never loads anything (no scripts, fonts, images or links
outside itself) and every piece of text taken from the dict is escaped.
"""

from __future__ import annotations

import html
import re
from datetime import timedelta
from typing import Any

from denpex.lite.report_text import (
    as_dict,
    cause_location,
    clean_lines,
    clean_text,
    exit_text,
    finding_text,
    format_bytes,
    format_clock,
    parse_ts,
)

_ROLES = ("cause", "symptom", "related", "observed", "finding", "context")
_LINE_PREVIEW = 320  # characters of an evidence line shown before "show all"
_SVG_W, _LABEL_W, _PAD_R, _TOP, _LANE_H, _BOTTOM = 1000, 170, 40, 58, 40, 30
_CSP = "default-src 'none'; style-src 'unsafe-inline'"  # the browser loads nothing, runs nothing
_CSS = """
:root{--red:#c62828;--amber:#b26a00;--green:#1b7f3b;--blue:#1f6feb;--grey:#8c959f;--ink:#1f2328;
--muted:#59636e;--line:#d0d7de;--bg:#f6f8fa} *{box-sizing:border-box}body{margin:0;
background:var(--bg);color:var(--ink);
font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1180px;margin:0 auto;padding:20px}header,section{background:#fff;
border:1px solid var(--line);border-radius:8px;padding:16px 20px;margin:0 0 14px}
header{border-left:6px solid var(--red)} header.v-ok{border-left-color:var(--green)}
header.v-unknown{border-left-color:var(--amber)}
.kicker{margin:0;color:var(--muted);font-size:12px;letter-spacing:.05em;text-transform:uppercase}
h1{font-size:22px;margin:4px 0 2px;overflow-wrap:anywhere}
h2{font-size:13px;margin:0 0 10px;color:var(--muted);letter-spacing:.05em;text-transform:uppercase}
.badge{display:inline-block;padding:1px 10px;border-radius:4px;color:#fff;background:var(--red);
font-size:15px;vertical-align:3px;margin-right:4px} .v-ok .badge{background:var(--green)}
.v-unknown .badge{background:var(--amber)} .lead{font-size:16px;margin:4px 0 0}
.facts{display:flex;flex-wrap:wrap;gap:8px 32px;margin:14px 0 0}
dt{font-size:12px;color:var(--muted)} dd{margin:0;overflow-wrap:anywhere}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"Liberation Mono",monospace;
font-size:12.5px} meter{width:90px;vertical-align:-2px;margin-right:6px}
.warn{background:#fff8e1;border-color:#e0b000} ul{margin:0;padding-left:20px} li{margin:4px 0}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;vertical-align:top;padding:6px 8px;border-bottom:1px solid var(--line)}
th{font-size:12px;color:var(--muted);font-weight:600;white-space:nowrap} td{white-space:nowrap}
td.line{white-space:normal;width:100%} td.line code{white-space:pre-wrap;overflow-wrap:anywhere}
td small{display:block;color:var(--muted)} tr.cause td{background:#fdecea}
tr:target td{background:#fff3bf} details summary{cursor:pointer;color:var(--blue);font-size:12px}
.role{font-weight:600} .r-cause{color:var(--red)} .r-symptom{color:var(--amber)}
.r-related{color:var(--blue)} .r-observed{color:var(--muted)} .empty{color:var(--muted);margin:0}
.r-finding{color:var(--red)} .r-context{color:var(--muted);font-style:italic}
section p{margin:0 0 8px} section p:last-child{margin:0} svg{display:block;width:100%;height:auto}
svg text{font:12px system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif;fill:var(--muted)}
svg .lane-label{fill:var(--ink);font-weight:600} svg .id{font-size:11px} .lane-bg{fill:#f6f8fa}
.lane-line,.tick{stroke:var(--line)} .axis{stroke:var(--muted)}
.m-cause{fill:var(--red);stroke:#fff;stroke-width:2} .halo{fill:var(--red);opacity:.18}
.m-symptom{fill:#fff;stroke:var(--amber);stroke-width:2.5}
.m-related{fill:var(--blue);stroke:#fff;stroke-width:1.5} .m-observed{fill:var(--grey)}
.m-finding{fill:#fff;stroke:var(--red);stroke-width:2.5} .m-context{fill:#fff;stroke:var(--grey)}
.link{fill:none;stroke:var(--amber);stroke-width:1.3;stroke-dasharray:4 3;opacity:.75}
footer{color:var(--muted);font-size:12px;text-align:center;margin:8px 0 20px}
"""


def _esc(value: object) -> str:
    # `&#58;` shows as ':' yet keeps text such as "https://…" in a log line from reading as a
    # reference to anything that greps the page for one.
    return html.escape(clean_text(value), quote=True).replace("://", "&#58;//")


def evidence_anchor(evidence_id: object) -> str:
    """The id of an evidence row, which the timeline's markers link to (the control plane's
    incident page uses it too, beside the same timeline)."""
    return "ev-" + re.sub(r"[^A-Za-z0-9_-]", "_", clean_text(evidence_id))


def _role(entry: dict[str, Any], cause_ids: set[str]) -> str:
    role = entry.get("role")
    if role in _ROLES:
        return str(role)
    return "cause" if entry.get("id") in cause_ids else "related"


def _where(host: object, rank: object) -> str:
    parts = [clean_text(host)] if host else []
    if isinstance(rank, int) and not isinstance(rank, bool):
        parts.append(f"rank {rank}")
    return " · ".join(parts)


def render_html(diag: dict[str, Any], *, title: str = "denpex diagnosis") -> str:
    """The whole page for one diagnosis, as a string of UTF-8-safe HTML."""
    rc = as_dict(diag.get("root_cause"))
    entries = [e for e in diag.get("timeline") or [] if isinstance(e, dict)]
    stats = as_dict(diag.get("stats"))
    cause_ids = {str(i) for i in rc.get("evidence") or []}
    known_ids = {str(e.get("id")) for e in entries}
    summary = "".join(f"<p>{_esc(p)}</p>" for p in clean_lines(diag.get("summary")))
    body = [
        _verdict(diag, rc, title),
        _dropped(stats),
        _section("summary", "Summary", summary),
        _section("findings", "Also failed, independently", _findings(diag.get("findings"))),
        _actions(diag.get("actions")),
        _section("timeline", "Timeline", timeline_svg(entries, cause_ids)),
        _section("evidence", "Evidence", _evidence_table(entries, cause_ids)),
        _contributing(diag.get("contributing"), known_ids),
        _section("stats", "Analysis", _stats(stats, diag.get("notes"))),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">\n'
        f"<title>{_esc(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n<main>\n"
        + "\n".join(part for part in body if part)
        + f"\n<footer>{_esc(diag.get('schema') or 'denpex.diagnosis/v1')}</footer>\n"
        "</main>\n</body>\n</html>\n"
    )


def _section(key: str, heading: str, inner: str) -> str:
    return f'<section id="{key}">\n<h2>{heading}</h2>\n{inner}\n</section>' if inner else ""


def _verdict(diag: dict[str, Any], rc: dict[str, Any], title: str) -> str:
    category = clean_text(rc.get("category")) or "unknown"
    ended = exit_text(diag.get("exit"))
    if diag.get("status") == "ok":
        kind, badge, h1 = "ok", "OK", "no failure found"
        lead = f"The job finished ({ended})." if ended else ""
    elif category == "unknown":
        kind, badge, h1 = "unknown", "FAILED", "no known signature matched"
        lead = f"The job failed ({ended or 'exit status unknown'}) but no known signature matched."
    else:
        kind, badge, h1 = "failed", "FAILED", category
        lead = clean_text(rc.get("title") or rc.get("explanation"))
    facts: list[tuple[str, str]] = [("exit", _esc(ended.removeprefix("exit ")))] if ended else []
    conf = rc.get("confidence")
    if kind == "failed" and isinstance(conf, int | float):
        value = min(max(float(conf), 0.0), 1.0)
        facts.append(
            ("confidence", f'<meter min="0" max="1" value="{value:.2f}"></meter>{value:.2f}')
        )
    if kind == "failed":
        facts += [
            (k, f"<code>{_esc(rc.get(k))}</code>") for k in ("signature", "rule") if rc.get(k)
        ]
        if _where(rc.get("host"), rc.get("rank")):
            facts.append(("where", _esc(_where(rc.get("host"), rc.get("rank")))))
        if cause_location(diag):
            facts.append(("line", f"<code>{_esc(cause_location(diag))}</code>"))
        if rc.get("frame"):
            facts.append(("frame", f"<code>{_esc(rc.get('frame'))}</code>"))
        if rc.get("attribution") == "host":
            facts.append(("attribution", "host context, not tied to this job"))
    dl = "".join(f"<div><dt>{k}</dt><dd>{v}</dd></div>" for k, v in facts)
    explain = rc.get("explanation") if kind == "failed" and rc.get("title") else ""
    return (
        f'<header class="v-{kind}">\n<p class="kicker">{_esc(title)}</p>\n'
        f'<h1><span class="badge">{badge}</span> {_esc(h1)}</h1>\n'
        + (f'<p class="lead">{_esc(lead)}</p>\n' if lead else "")
        + (f"<p>{_esc(explain)}</p>\n" if explain else "")
        + (f'<dl class="facts">{dl}</dl>\n' if dl else "")
        + "</header>"
    )


def _findings(items: object) -> str:
    rows = [
        f"<li>{_esc(finding_text(item))}</li>"
        for item in (items if isinstance(items, list) else [])
        if isinstance(item, dict)
    ]
    return f"<ul>{''.join(rows)}</ul>" if rows else ""


def _dropped(stats: dict[str, Any]) -> str:
    dropped = stats.get("dropped_analysis_bytes")
    if not isinstance(dropped, int) or dropped <= 0:
        return ""
    return (
        f'<section class="warn" id="dropped"><strong>Analysis skipped {format_bytes(dropped)} of '
        "output</strong> because it could not keep up, so some evidence may be missing. The "
        "output itself was not affected.</section>"
    )


def _actions(actions: object) -> str:
    items = []
    for act in actions if isinstance(actions, list) else []:
        if isinstance(act, dict):
            target = f" <code>{_esc(act.get('target'))}</code>" if act.get("target") else ""
            items.append(
                f"<li><strong>{_esc(act.get('action'))}</strong>{target}: "
                f"{_esc(act.get('reason'))}</li>"
            )
    return _section("actions", "What to do", f"<ul>{''.join(items)}</ul>" if items else "")


def _positions(entries: list[dict[str, Any]]) -> tuple[list[float], list[str]]:
    """x of each entry (by time when at least two distinct timestamps exist, else by order)
    and the axis tick labels placed evenly from left to right."""
    left, plot = _LABEL_W + 20, _SVG_W - _LABEL_W - 20 - _PAD_R
    times = [parse_ts(e.get("ts")) for e in entries]
    known = [(i, t.timestamp()) for i, t in enumerate(times) if t is not None]
    lo, hi = min((s for _, s in known), default=0.0), max((s for _, s in known), default=0.0)
    if len(known) < 2 or hi <= lo:
        n = len(entries)
        return [left + plot * (i + 0.5) / n for i in range(n)], ["in the order seen"]
    secs: list[float] = []
    for i in range(len(entries)):  # an entry without a time sits between its neighbours
        before = [(j, s) for j, s in known if j <= i] or [known[0]]
        after = [(j, s) for j, s in known if j >= i] or [known[-1]]
        (j0, s0), (j1, s1) = before[-1], after[0]
        secs.append(s0 if j1 == j0 else s0 + (s1 - s0) * (i - j0) / (j1 - j0))
    start = next(t for t in times if t is not None)
    offset = start.timestamp() - lo
    fmt = "%H:%M:%S" if hi - lo >= 10 else "%H:%M:%S.%f"
    ticks = [
        (start + timedelta(seconds=(hi - lo) * k / 4 - offset)).strftime(fmt) for k in range(5)
    ]
    return [left + plot * (s - lo) / (hi - lo) for s in secs], [t[:12] for t in ticks]


# The legend is fixed text; markers reuse the classes the timeline draws with.
_LEGEND = (
    '<circle class="m-cause" cx="20" cy="14" r="6"/><text x="32" y="18">cause</text>'
    '<circle class="m-symptom" cx="100" cy="14" r="6"/><text x="112" y="18">symptom</text>'
    '<circle class="m-related" cx="195" cy="14" r="6"/><text x="207" y="18">related</text>'
    '<circle class="m-observed" cx="285" cy="14" r="6"/><text x="297" y="18">observed</text>'
    '<path class="link" d="M380,14 h34"/><text x="422" y="18">cause led to symptom</text>'
)
_RADIUS = {"cause": 9, "symptom": 6, "related": 5, "observed": 4, "finding": 7, "context": 4}


def _lane_key(entry: dict[str, Any]) -> tuple[str, int | None]:
    rank = entry.get("rank")
    return clean_text(entry.get("host")), rank if isinstance(rank, int) else None


def timeline_svg(entries: list[dict[str, Any]], cause_ids: set[str]) -> str:
    """Inline SVG: one lane per host/rank, one marker per entry, dashed cause→symptom links.
    Classes only, no style attributes (the control plane serves it under a strict CSP)."""
    if not entries:
        return '<p class="empty">No evidence lines on the timeline.</p>'
    lanes = sorted(
        {_lane_key(e) for e in entries}, key=lambda k: (not k[0], k[0], k[1] is None, k[1] or 0)
    )
    lane_y = {k: _TOP + _LANE_H * i + _LANE_H / 2 for i, k in enumerate(lanes)}
    xs, ticks = _positions(entries)
    axis_y = _TOP + _LANE_H * len(lanes) + 6
    height, right = axis_y + _BOTTOM, _SVG_W - 10
    out = [
        f'<svg viewBox="0 0 {_SVG_W} {height}" role="img" aria-label="timeline of evidence">',
        _LEGEND,
    ]
    for i, key in enumerate(lanes):
        y, name = lane_y[key], _where(*key) or "host/rank unknown"
        band = f'<rect class="lane-bg" x="0" y="{y - _LANE_H / 2}" width="{_SVG_W}" height="'
        out.append(
            f'<g class="lane" data-lane="{_esc(name)}">'
            + (f'{band}{_LANE_H}"/>' if i % 2 == 0 else "")
            + f'<line class="lane-line" x1="{_LABEL_W}" y1="{y}" x2="{right}" y2="{y}"/>'
            f'<text class="lane-label" x="{_LABEL_W - 10}" y="{y + 4}" text-anchor="end">'
            f"{_esc(name if len(name) <= 24 else name[:23] + '…')}</text></g>"
        )
    out.append(f'<line class="axis" x1="{_LABEL_W}" y1="{axis_y}" x2="{right}" y2="{axis_y}"/>')
    left, plot = _LABEL_W + 20, _SVG_W - _LABEL_W - 20 - _PAD_R
    if len(ticks) == 1:
        out.append(f'<text x="{left}" y="{axis_y + 18}">{_esc(ticks[0])}</text>')
    for k, tick in enumerate(ticks if len(ticks) > 1 else []):
        x = left + plot * k / (len(ticks) - 1)
        anchor = "start" if k == 0 else "end" if k == len(ticks) - 1 else "middle"
        out.append(
            f'<line class="tick" x1="{x:.1f}" y1="{_TOP - 8}" x2="{x:.1f}" y2="{axis_y}"/>'
            f'<text x="{x:.1f}" y="{axis_y + 18}" text-anchor="{anchor}">{tick}</text>'
        )
    points = [
        (e, _role(e, cause_ids), x, lane_y[_lane_key(e)]) for e, x in zip(entries, xs, strict=True)
    ]
    for x0, y0 in [(x, y) for _, role, x, y in points if role == "cause"]:
        for _, role, x1, y1 in points:
            if role == "symptom":
                mid = (x0 + x1) / 2
                out.append(
                    f'<path class="link" d="M{x0:.1f},{y0:.1f} C{mid:.1f},{y0:.1f} '
                    f'{mid:.1f},{y1:.1f} {x1:.1f},{y1:.1f}"/>'
                )
    marks: list[tuple[bool, str]] = []
    last_label: dict[float, tuple[float, bool]] = {}
    for entry, role, x, y in sorted(points, key=lambda p: p[2]):
        prev_x, prev_up = last_label.get(y, (-1e9, False))
        up = not prev_up if x - prev_x < 34 else True  # ids of close markers alternate sides
        last_label[y] = (x, up)
        marks.append((role == "cause", _marker(entry, role, x, y, up)))
    out += [m for _, m in sorted(marks, key=lambda m: m[0])]  # the cause is drawn on top
    return "\n".join([*out, "</svg>"])


def _marker(entry: dict[str, Any], role: str, x: float, y: float, up: bool) -> str:
    tip = f"{entry.get('id')} · {format_clock(entry.get('ts'))} · {entry.get('category')} · "
    tip += clean_text(entry.get("line"))[:240]
    mark = f'<circle class="m-{role}" cx="{x:.1f}" cy="{y:.1f}" r="{_RADIUS[role]}"/>'
    if role == "cause":
        mark = f'<circle class="halo" cx="{x:.1f}" cy="{y:.1f}" r="15"/>' + mark
    return (
        f'<a href="#{evidence_anchor(entry.get("id"))}"><title>{_esc(tip)}</title>{mark}'
        f'<text class="id" x="{x:.1f}" y="{y - 12 if up else y + 21:.1f}" text-anchor="middle">'
        f"{_esc(entry.get('id'))}</text></a>"
    )


def _table(columns: tuple[str, ...], rows: list[str]) -> str:
    head = "".join(f"<th>{c}</th>" for c in columns)
    body = "\n".join(rows)
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"


def _evidence_table(entries: list[dict[str, Any]], cause_ids: set[str]) -> str:
    rows = []
    for entry in entries:
        role, line, rank = _role(entry, cause_ids), clean_text(entry.get("line")), entry.get("rank")
        shown = f"<code>{_esc(line)}</code>"
        if len(line) > _LINE_PREVIEW:
            shown = (
                f"<code>{_esc(line[:_LINE_PREVIEW])}…</code><details><summary>show all "
                f"{len(line):,} characters</summary><code>{_esc(line)}</code></details>"
            )
        cells = [
            f'<a href="#{evidence_anchor(entry.get("id"))}">{_esc(entry.get("id"))}</a>',
            f'<span class="mono">{format_clock(entry.get("ts"))}</span>',
            _esc(entry.get("host")),
            _esc(rank) if isinstance(rank, int) else "",
            _esc(entry.get("source")),
            f"{_esc(entry.get('category'))}<small>{_esc(entry.get('signature'))}</small>",
            f'<span class="role r-{role}">{role}</span>',
        ]
        tds = "".join(f"<td>{c}</td>" for c in cells) + f'<td class="line">{shown}</td>'
        rows.append(f'<tr id="{evidence_anchor(entry.get("id"))}" class="{role}">{tds}</tr>')
    columns = ("id", "time", "host", "rank", "source", "category", "role", "line")
    return _table(columns, rows) if rows else ""


def _contributing(items: object, known_ids: set[str]) -> str:
    rows = []
    for item in [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []:
        ids = [str(i) for i in item.get("evidence") or []]
        links = ", ".join(
            f'<a href="#{evidence_anchor(i)}">{_esc(i)}</a>' if i in known_ids else _esc(i)
            for i in ids
        )
        role = clean_text(item.get("role"))
        cells = [
            f"{_esc(item.get('category'))}<small>{_esc(item.get('signature'))}</small>",
            f'<span class="role r-{role if role in _ROLES else "other"}">{_esc(role)}</span>',
            _esc(item.get("count", 1)),
            _esc(_where(item.get("host"), item.get("rank"))),
            links,
        ]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    columns = ("category", "role", "count", "where", "evidence")
    return _section("contributing", "Contributing", _table(columns, rows) if rows else "")


def _stats(stats: dict[str, Any], notes: object) -> str:
    def count(key: str) -> str:
        value = stats.get(key)
        return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else "0"

    shown = {
        "bytes scanned": format_bytes(stats.get("bytes")),
        "lines scanned": count("lines"),
        "lines matched": count("matches"),
        "analysis input dropped": format_bytes(stats.get("dropped_analysis_bytes")),
    }
    for key, value in stats.items():
        if key not in ("bytes", "lines", "matches", "dropped_analysis_bytes"):
            shown[clean_text(key).replace("_", " ")] = clean_text(value)
    dl = "".join(f"<div><dt>{_esc(k)}</dt><dd>{_esc(v)}</dd></div>" for k, v in shown.items())
    items = "".join(f"<li>{_esc(n)}</li>" for n in notes if n) if isinstance(notes, list) else ""
    return f'<dl class="facts">{dl}</dl>' + (f"\n<h2>Notes</h2><ul>{items}</ul>" if items else "")
