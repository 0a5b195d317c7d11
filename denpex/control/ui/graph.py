"""The causal graph of an incident as server-side SVG: the root cause on the left, one node
per symptom category on the right (ordered by layer: log, kernel, GPU, fabric, SDK), an
arrow from cause to each symptom, each node linking to its first evidence row.

A pure function of the incident and its evidence rows; every text is escaped, and the SVG
carries classes only (no style attributes: the page's CSP forbids inline style).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from denpex.control.ui.views import LAYERS
from denpex.lite.report_html import evidence_anchor

_W, _NODE_W, _NODE_H, _GAP, _TOP = 900, 330, 54, 14, 34
_LAYER_ORDER = {name: i for i, name in enumerate(LAYERS.values())}


@dataclass(slots=True)
class Node:
    category: str
    layer: str
    role: str
    where: set[str] = field(default_factory=set)
    evidence: list[str] = field(default_factory=list)  # anchors of its evidence rows


def nodes_of(incident: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[Node, list[Node]]:
    """(cause, symptoms): evidence rows whose role is `cause` make the cause node; the
    others are grouped by category."""
    from denpex.control.ui.views import layer_of

    cause = Node(incident["category"], layer_of(incident["category"]), "cause")
    symptoms: dict[str, Node] = {}
    for row in rows:
        where = row["host"] or ""
        if row["rank"] is not None:
            where += f" rank {row['rank']}"
        if row["role"] == "cause" or row["category"] == cause.category:
            node = cause
        else:
            node = symptoms.setdefault(
                row["category"] or "uncategorised",
                Node(row["category"] or "uncategorised", row["layer"], row["role"]),
            )
        node.where.add(where.strip())
        node.evidence.append(row["anchor"])
    ordered = sorted(symptoms.values(), key=lambda n: (_LAYER_ORDER.get(n.layer, 9), n.category))
    return cause, ordered


def causal_svg(incident: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    cause, symptoms = nodes_of(incident, rows)
    count = max(1, len(symptoms))
    height = _TOP + count * (_NODE_H + _GAP) + 10
    cause_y = _TOP + (count * (_NODE_H + _GAP) - _GAP) / 2 - _NODE_H / 2
    right_x = _W - _NODE_W - 10
    out = [
        f'<svg class="causal" viewBox="0 0 {_W} {height:.0f}" role="img" '
        f'aria-label="causal graph: {_esc(cause.category)} and {len(symptoms)} symptom(s)">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path class="g-arrow" d="M0,0 L10,5 '
        'L0,10 z"/></marker></defs>',
        f'<text class="g-head" x="10" y="18">cause</text>'
        f'<text class="g-head" x="{right_x}" y="18">symptoms</text>',
    ]
    for i in range(len(symptoms)):
        y = _TOP + i * (_NODE_H + _GAP)
        x0, y0, y1 = 10 + _NODE_W, cause_y + _NODE_H / 2, y + _NODE_H / 2
        mid = (x0 + right_x) / 2
        out.append(
            f'<path class="g-edge" marker-end="url(#arrow)" d="M{x0},{y0:.1f} C{mid:.1f},'
            f'{y0:.1f} {mid:.1f},{y1:.1f} {right_x - 2},{y1:.1f}"/>'
        )
    out.append(_node(cause, 10, cause_y))
    out += [_node(n, right_x, _TOP + i * (_NODE_H + _GAP)) for i, n in enumerate(symptoms)]
    if not symptoms:
        out.append(
            f'<text class="g-none" x="{right_x}" y="{_TOP + 30}">no symptom evidence linked</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


def _node(node: Node, x: float, y: float) -> str:
    where = ", ".join(sorted(w for w in node.where if w)) or "host unknown"
    if len(where) > 28:
        where = where[:27] + "…"
    detail = f"{node.layer} · {where} · {len(node.evidence)} evidence"
    label = node.category if len(node.category) <= 34 else node.category[:33] + "…"
    box = (
        f'<g class="g-node g-{node.role if node.role == "cause" else "symptom"} '
        f'layer-{_esc(node.layer.lower())}" data-category="{_esc(node.category)}">'
        f'<rect x="{x}" y="{y:.1f}" width="{_NODE_W}" height="{_NODE_H}" rx="8"/>'
        f'<text class="g-label" x="{x + 12}" y="{y + 22:.1f}">{_esc(label)}</text>'
        f'<text class="g-detail" x="{x + 12}" y="{y + 41:.1f}">{_esc(detail)}</text></g>'
    )
    if node.evidence:
        return f'<a href="#{node.evidence[0]}"><title>{_esc(node.category)}</title>{box}</a>'
    return box


def row_anchor(row: dict[str, Any]) -> str:
    """The evidence table's row id: the timeline's own id for the primary report's rows (so
    the swim-lane markers of the report renderer land on them), the stored id otherwise."""
    return evidence_anchor(row["local_id"] or row["id"])


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)
