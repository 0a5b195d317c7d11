"""The short human verdict `denpex run` prints on stderr: a `denpex.diagnosis/v1` dict as text.

A pure function of the dict: it never does I/O, never writes a line wider than the width it
is given, and never emits an ANSI escape unless asked for colour.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import UTC, datetime
from typing import Any

from denpex.diagnosis.summary import coverage_note

# A line is built as segments (text, style); styles become ANSI SGR codes only with colour.
Segment = tuple[str, str]
_SGR = {"bad": "1;31", "good": "1;32", "warn": "1;33", "bold": "1", "dim": "2", "head": "1"}
_ROLE_LABEL = {
    "cause": ("CAUSE", "bad"),
    "symptom": ("symptom", "dim"),
    "finding": ("ALSO", "warn"),
    "context": ("host", "dim"),
}
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x9b[0-?]*[ -/]*[@-~]"  # CSI
    r"|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC, DCS, SOS, PM, APC strings
    r"|\x1b[ -/]*[0-~]?"  # other escapes (and a lone ESC)
)
_SPACES = re.compile(r"[\t\n\r\x0b\x0c\x85\u2028\u2029]")
# Controls, bidi overrides, zero-width marks, noncharacters and lone surrogates: never shown.
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff\ufffe\uffff]"
)
_SURROGATE = re.compile("[\ud800-\udfff]")
_MIN_WIDTH = 8
_CAUSE_LINES = 3  # the cause line may wrap onto this many lines; others are cut to one


def clean_text(value: object) -> str:
    """`value` as one line of printable text: escapes stripped, controls and invalid code points
    removed or replaced, so it can be printed or encoded as UTF-8 safely."""
    if value is None:
        return ""
    text = _ANSI.sub("", str(value))
    text = _SPACES.sub(" ", text)
    text = _SURROGATE.sub("\ufffd", text)
    return _UNSAFE.sub("", text)


def parse_ts(ts: object) -> datetime | None:
    """An ISO 8601 timestamp as an aware datetime (naive ones are taken as UTC), else None."""
    if not isinstance(ts, str) or not ts:
        return None
    try:
        moment = datetime.fromisoformat(ts.strip())
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def format_clock(ts: object) -> str:
    """`HH:MM:SS.mmm` of an ISO timestamp in its own offset, or `--`."""
    moment = parse_ts(ts)
    if moment is None:
        return "--"
    return f"{moment:%H:%M:%S}.{moment.microsecond // 1000:03d}"


def format_bytes(count: object) -> str:
    """A byte count for people: `0 B`, `812 B`, `1.2 MB` (decimal units)."""
    n = count if isinstance(count, int) and count > 0 else 0
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("KB", "MB", "GB", "TB"):
        value /= 1000.0
        if value < 999.95 or unit == "TB":
            break
    return f"{value:.1f} {unit}"


def exit_text(exit_info: object) -> str:
    """`exit 137, SIGKILL`, `exit 1`, `signal SIGTERM`, or '' when the exit is unknown."""
    info = exit_info if isinstance(exit_info, dict) else {}
    code, signal = info.get("code"), clean_text(info.get("signal"))
    if code is not None and signal:
        return f"exit {code}, {signal}"
    if code is not None:
        return f"exit {code}"
    return f"signal {signal}" if signal else ""


def _how_it_ended(exit_info: object) -> str:
    info = exit_info if isinstance(exit_info, dict) else {}
    code, signal = info.get("code"), clean_text(info.get("signal"))
    if signal:
        return f"it was killed by {signal}" + (f" (exit code {code})" if code is not None else "")
    return f"it exited with code {code}" if code is not None else "its exit status is unknown"


def _cells(ch: str) -> int:
    # Combining marks count one column, not none: a line is then never longer than its width in
    # characters either, and only ever looks narrower than measured.
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def display_width(text: str) -> int:
    """Terminal columns `text` takes at most (wide characters count two, all others one)."""
    return sum(_cells(ch) for ch in text)


def _split_at(text: str, columns: int) -> tuple[str, str]:
    """The longest head of `text` that fits in `columns` (at least one character), and the rest."""
    used = 0
    for i, ch in enumerate(text):
        used += _cells(ch)
        if used > columns and i > 0:
            return text[:i], text[i:]
    return text, ""


def _truncate(segments: list[Segment], width: int) -> list[Segment]:
    """Cut a line of segments to `width` columns, ending with `…` when something was cut."""
    if display_width("".join(text for text, _ in segments)) <= width:
        return segments
    out: list[Segment] = []
    room = width - 1
    for text, style in segments:
        head, rest = _split_at(text, room)
        if display_width(head) > room:
            head = ""
        if head:
            out.append((head, style))
            room -= display_width(head)
        if rest or not head:
            break
    return [*out, ("…", out[-1][1] if out else "")]


def _wrap(segments: list[Segment], width: int, indent: int, hang: int) -> list[list[Segment]]:
    """Fill words of `segments` into lines of `width` columns; later lines indent by `hang`."""
    words: list[tuple[str, str, bool]] = []
    space = False
    for text, style in segments:
        for part in re.split(r"( +)", text):
            if part.startswith(" "):
                space = True
            elif part:
                words.append((part, style, space))
                space = False
    indent, hang = min(indent, width // 2), min(hang, width // 2)
    lines: list[list[Segment]] = [[(" " * indent, "")]]
    col, start = indent, indent
    prev = ""
    for word, style, space in words:
        size = display_width(word)
        if col > start and col + 1 + size > width:
            lines.append([(" " * hang, "")])
            col = start = hang
        if col > start and space:
            lines[-1].append((" ", style if style == prev else ""))
            col += 1
        prev = style
        while size > width - col:
            if col > start:
                lines.append([(" " * hang, "")])
                col = start = hang
                continue
            head, word = _split_at(word, width - col)
            lines[-1].append((head, style))
            lines.append([(" " * hang, "")])
            col = start = hang
            size = display_width(word)
        if word:
            lines[-1].append((word, style))
            col += size
    return lines


class _Lines:
    """The lines of one report; each is cut to the width and coloured only when asked."""

    def __init__(self, width: int, color: bool) -> None:
        self.width, self.color = width, color
        self.lines: list[str] = []

    def add(self, *segments: Segment) -> None:
        parts: list[Segment] = []
        for text, style in segments:
            text = clean_text(text).replace("\xa0", " ")
            if parts and parts[-1][1] == style:
                parts[-1] = (parts[-1][0] + text, style)
            elif text:
                parts.append((text, style))
        parts = _truncate(parts, self.width)
        if self.color:
            self.lines.append("".join(_paint(text, style) for text, style in parts).rstrip())
        else:
            self.lines.append("".join(text for text, _ in parts).rstrip())

    def para(self, *segments: Segment, indent: int = 2, hang: int | None = None) -> None:
        cleaned = [(clean_text(t), s) for t, s in segments if t]
        hang = indent if hang is None else hang
        for line in _wrap(cleaned, self.width, indent, hang):
            self.add(*line)


def _paint(text: str, style: str) -> str:
    code = _SGR.get(style)
    return f"\x1b[{code}m{text}\x1b[0m" if code and text.strip() else text


def render_text(diag: dict[str, Any], *, color: bool, width: int = 80) -> str:
    """The verdict for one diagnosis, as lines no wider than `width` (at least 8), ending in a
    newline. ANSI colour only when `color` is true."""
    out = _Lines(max(int(width), _MIN_WIDTH), color)
    rc = as_dict(diag.get("root_cause"))
    ended = exit_text(diag.get("exit"))
    if diag.get("status") == "ok":
        _render_ok(out, diag, ended)
    else:
        _render_failed(out, diag, rc, ended)
    return "\n".join(out.lines) + "\n"


def render_block(lines: list[str], *, color: bool, width: int = 80) -> str:
    """The retrieval block's lines (denpex.retrieval.block) under the verdict: headings as
    headings, entries wrapped under their citation; '' when there is nothing to show."""
    if not lines:
        return ""
    out = _Lines(max(int(width), _MIN_WIDTH), color)
    for line in lines:
        if line.startswith("  "):
            out.para((line.strip(), ""), indent=2, hang=6)
        elif line.startswith("note: "):
            out.para((line, "dim"), indent=0, hang=2)
        else:
            out.add((line, "head"))
    return "\n".join(out.lines) + "\n"


def _render_ok(out: _Lines, diag: dict[str, Any], ended: str) -> None:
    lost = _dicts(diag.get("coverage_lost"))
    if lost:  # never a plain OK when a check stopped: say what was not watched
        verdict = f"job finished ({ended})" if ended else "finished"
        out.para(
            ("denpex: ", ""),
            (verdict, "warn"),
            (" — no failure found, but the run was not fully checked", ""),
            indent=0,
            hang=2,
        )
        for item in lost[:4]:
            out.para((f"not checked: {clean_text(coverage_note(item))}", "warn"), hang=4)
    else:
        verdict = f"job finished OK ({ended})" if ended else "OK"
        out.para(("denpex: ", ""), (verdict, "good"), (" — no failure found", ""), indent=0, hang=2)
    context = [c for c in _dicts(diag.get("contributing")) if c.get("role") == "context"]
    if context:
        total = sum(_count(c) for c in context)
        kinds = ", ".join(clean_text(c.get("category")) for c in context[:4])
        out.para((f"{total} host event(s) not tied to this job: {kinds}", "dim"), hang=4)
    seen = [c for c in _dicts(diag.get("contributing")) if c.get("role") == "observed"]
    if seen:
        total = sum(_count(c) for c in seen)
        kinds = ", ".join(f"{clean_text(c.get('category'))} ×{_count(c)}" for c in seen[:4])
        more = f", +{len(seen) - 4} more" if len(seen) > 4 else ""
        noun = "warning" if total == 1 else "warnings"
        out.para((f"{total} {noun} seen, none of them a failure: {kinds}{more}", "dim"), hang=4)
    _render_dropped(out, diag.get("stats"))
    for note in [clean_text(n) for n in diag.get("notes") or []][:3]:  # what was not read
        out.para((f"note: {note}", ""), indent=0, hang=2)


def _render_failed(out: _Lines, diag: dict[str, Any], rc: dict[str, Any], ended: str) -> None:
    category = clean_text(rc.get("category")) or "unknown"
    head: list[Segment] = [("denpex: ", ""), ("job " if ended else "", ""), ("FAILED", "bad")]
    head.append((f" ({ended}) — " if ended else " — ", ""))
    if category == "unknown":
        out.para(*head, ("no known signature matched", "bold"), indent=0, hang=2)
        how = _how_it_ended(diag.get("exit"))
        out.para((f"The job failed but no known failure signature matched; {how}.", ""))
    else:
        conf = rc.get("confidence")
        sure = f" (confidence {float(conf):.2f})" if isinstance(conf, int | float) else ""
        out.para(*head, ("root cause: ", ""), (category, "bold"), (sure, ""), indent=0, hang=2)
    title = clean_lines(rc.get("title")) or clean_lines(rc.get("explanation"))[:1]
    for line in title:
        out.para((line, "bold"))
    # No-break spaces keep each fact whole when the line wraps; `add` prints them as spaces.
    facts = [f"{k}\xa0{clean_text(rc.get(k))}" for k in ("signature", "rule", "host") if rc.get(k)]
    if rc.get("rank") is not None:
        facts.append(f"rank\xa0{clean_text(rc.get('rank'))}")
    where = cause_location(diag)
    if where:
        facts.append(f"at\xa0{where}")
    if rc.get("frame"):
        facts.append(f"in\xa0{clean_text(rc.get('frame'))}")
    if rc.get("attribution") == "host":
        facts.append("host\xa0context, not\xa0tied\xa0to\xa0this\xa0job")
    if facts and category != "unknown":
        out.para(("\xa0· ".join(facts), "dim"))
    for paragraph in clean_lines(diag.get("summary")):
        if not any(paragraph in line for line in title):
            out.para((paragraph, ""))
    _render_dropped(out, diag.get("stats"))
    for finding in _dicts(diag.get("findings")):
        out.add(("also: ", "warn"), (finding_text(finding), ""))  # one line each, cut to width
    _render_timeline(out, diag)
    actions = _dicts(diag.get("actions"))
    if actions:
        out.add(("what to do", "head"))
    for act in actions:
        target = f" ({clean_text(act.get('target'))})" if act.get("target") else ""
        name = clean_text(act.get("action")) or "action"
        out.para((name + target, "bold"), (": " + clean_text(act.get("reason")), ""), hang=4)
    _render_stats(out, diag.get("stats"))
    for note in [clean_text(n) for n in diag.get("notes") or []][:3]:
        out.para((f"note: {note}", "dim"), indent=0, hang=2)


def cause_location(diag: dict[str, Any]) -> str:
    """`file:line` of the root cause's first line, from its timeline row, or ''."""
    ids = (as_dict(diag.get("root_cause")).get("evidence") or [])[:1]
    for row in _dicts(diag.get("timeline")):
        if row.get("id") in ids and row.get("file") and _int(row.get("lineno")):
            return f"{clean_text(row['file'])}:{row['lineno']}"
    return ""


def finding_text(finding: dict[str, Any]) -> str:
    """One independent finding in a line: category, where, what."""
    where = " ".join(
        p
        for p in (
            f"rank {clean_text(finding.get('rank'))}" if finding.get("rank") is not None else "",
            f"on {clean_text(finding.get('host'))}" if finding.get("host") else "",
        )
        if p
    )
    what = clean_lines(finding.get("title"))[:1] or clean_lines(finding.get("explanation"))[:1]
    head = clean_text(finding.get("category")) + (f" ({where})" if where else "")
    return (
        head
        + (f" — {what[0]}" if what else "")
        + " — a failure of its own, not caused by the root cause"
    )


def _render_timeline(out: _Lines, diag: dict[str, Any]) -> None:
    entries = _dicts(diag.get("timeline"))
    if not entries:
        return
    matches = _int((diag.get("stats") or {}).get("matches"))
    of = f"{len(entries)} of {matches} matching lines" if matches >= len(entries) else ""
    out.add(("timeline", "head"), (f" ({of or f'{len(entries)} entries'})", ""))
    cause_ids = set((diag.get("root_cause") or {}).get("evidence") or [])
    hosts = [clean_text(e.get("host")) for e in entries]
    hosts = [h if len(h) <= 14 else h[:13] + "…" for h in hosts]
    ranks = [f"r{clean_text(e['rank'])}" if e.get("rank") is not None else "" for e in entries]
    host_w, rank_w = max(map(display_width, hosts)), max(map(len, ranks))
    for entry, host, rank in zip(entries, hosts, ranks, strict=True):
        role = entry.get("role") or ("cause" if entry.get("id") in cause_ids else "related")
        label, style = _ROLE_LABEL.get(role, (clean_text(role), ""))
        cols = [format_clock(entry.get("ts")).ljust(12)]
        if host_w:
            cols.append(host + " " * (host_w - display_width(host)))
        if rank_w:
            cols.append(rank.ljust(rank_w))
        line = clean_text(entry.get("line")).strip()
        if rank:  # the rank column already says what a torchrun `[rank3]:` prefix says
            line = re.sub(rf"^\[(?:rank|default){re.escape(rank[1:])}\]: *", "", line)
        prefix = "  " + " ".join(cols) + "  "
        body = [[(line, "dim" if role == "symptom" else "")]]  # `add` cuts it, ending in `…`
        if role == "cause":  # the line that matters most may wrap onto a few lines
            body = _wrap(body[0], max(out.width - len(prefix) - 9, 1), 0, 0)
            if len(body) > _CAUSE_LINES:
                body = body[:_CAUSE_LINES]
                body[-1] = [*body[-1], (" …", "")]
        out.add((prefix, "dim"), (f"{label:<8}", style), (" ", ""), *body[0])
        for more in body[1:]:
            out.add((" " * (len(prefix) + 9), ""), *more)


def _render_dropped(out: _Lines, stats: object) -> None:
    dropped = _int(stats.get("dropped_analysis_bytes")) if isinstance(stats, dict) else 0
    if dropped:
        relayed = _int(stats.get("relayed_bytes")) if isinstance(stats, dict) else 0
        share = (
            f" ({dropped / relayed:.1%} of {format_bytes(relayed)}; it read the rest)"
            if relayed >= dropped > 0
            else ""
        )
        why = (
            f"analysis skipped {format_bytes(dropped)} of output{share} because it could not "
            "keep up, so evidence may be missing; the output itself was not affected."
        )
        out.para(("warning: ", "warn"), (why, ""), indent=0, hang=2)


def _render_stats(out: _Lines, stats: object) -> None:
    stats = stats if isinstance(stats, dict) else {}
    matches, lines = _int(stats.get("matches")), _int(stats.get("lines"))
    dropped = _int(stats.get("dropped_analysis_bytes"))
    tail = f"{format_bytes(dropped)} of analysis input dropped" if dropped else "nothing dropped"
    scanned = f"{matches:,} of {lines:,} lines matched ({format_bytes(stats.get('bytes'))} scanned)"
    out.para(("evidence: ", "dim"), (f"{scanned}; {tail}", "dim"), indent=0, hang=2)


def clean_lines(text: object) -> list[str]:
    """The non-blank lines of a multi-line text, each cleaned and stripped."""
    if not text:
        return []
    return [p for p in (clean_text(raw).strip() for raw in str(text).splitlines()) if p]


def as_dict(value: object) -> dict[str, Any]:
    """`value` when it is a dict, else an empty one (the renderers accept any JSON)."""
    return value if isinstance(value, dict) else {}


def _dicts(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _count(item: dict[str, Any]) -> int:
    return max(_int(item.get("count")), 1)
