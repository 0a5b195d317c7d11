"""The audit hash chain: an intact export verifies; every kind of tampering names the first
bad line; a signed anchor detects a rewritten tail."""

from __future__ import annotations

import pytest

from denpex.core import audit, signing


def chain(n: int) -> list[dict]:
    head, records = audit.EMPTY, []
    for i in range(n):
        rec = audit.seal(
            head,
            ts_ns=1_700_000_000_000_000_000 + i,
            kind="step.finished" if i % 2 else "step.started",
            actor="policy:autosafe",
            tenant="acme",
            subject=f"plan {i // 2}",
            why={"incident": 3, "evidence": [f"e{i}"]},
            result={"ok": True, "detail": "drain n2 \u00e9\n"},
        )
        records.append(rec)
        head = audit.head_of(rec)
    return records


def export(records: list[dict], signature: str | None = None) -> list[bytes]:
    head = audit.head_of(records[-1]) if records else audit.EMPTY
    return [audit.canonical(r) for r in records] + [audit.anchor_line(head, signature)]


def test_intact_chain_verifies_and_names_its_head() -> None:
    records = chain(20)
    verdict = audit.verify_lines(export(records))
    assert verdict.ok and verdict.records == 20 and verdict.head == audit.head_of(records[-1])
    assert verdict.anchor == verdict.head
    assert audit.verify_lines(export([])).ok


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match=r"audit\.yaml"):
        audit.seal(
            audit.EMPTY, ts_ns=0, kind="x", actor="a", tenant=None, subject="", why={}, result={}
        )


@pytest.mark.parametrize(
    "tamper, line, reason",
    [
        (lambda ls: ls.__setitem__(3, ls[3].replace(b"plan 1", b"plan 9")), 4, "changed"),
        (lambda ls: ls.__delitem__(5), 6, "sequence"),
        (lambda ls: ls.insert(4, ls.pop(6)), 5, "sequence"),
        (lambda ls: ls.insert(2, ls[1]), 3, "sequence"),
        (lambda ls: ls.__delitem__(-1), 21, "anchor"),
        (lambda ls: ls.__setitem__(0, ls[0] + b" "), 1, "canonical"),
        (lambda ls: ls.__setitem__(7, ls[7][:40]), 8, "not JSON"),
    ],
    ids=["byte-changed", "removed", "reordered", "inserted", "tail-cut", "whitespace", "cut"],
)
def test_tampering_names_the_first_bad_line(tamper, line: int, reason: str) -> None:
    lines = export(chain(20))
    tamper(lines)
    verdict = audit.verify_lines(lines)
    assert not verdict.ok
    assert verdict.line == line and reason in verdict.reason, verdict.describe()


def test_a_rewritten_tail_with_a_fresh_anchor_fails_the_signature() -> None:
    key = signing.generate_keypair()
    records = chain(10)
    signed = export(records, audit.sign_anchor(audit.head_of(records[-1]), key))
    verdict = audit.verify_lines(signed)
    assert verdict.ok
    audit.verify_anchor(verdict.anchor, verdict.signature, key.public_key())
    # cut three records and write an anchor for the shorter chain: the chain is consistent,
    # but its anchor carries no signature of the site key
    forged = export(records[:7])
    verdict = audit.verify_lines(forged)
    assert verdict.ok
    with pytest.raises(signing.SignatureError):
        audit.verify_anchor(verdict.anchor, verdict.signature, key.public_key())
    # and an anchor kept apart from an earlier export is no longer reached
    assert audit.contains(forged, audit.head_of(records[6]))
    assert not audit.contains(forged, audit.head_of(records[8]))
