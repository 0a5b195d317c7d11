"""What a training-series detector reports: a Finding (a detector id of the catalog,
denpex/core/detectors.yaml, with its captures and the values its summary needs), before its
caller makes it Evidence with host, rank, time and id (`Finding.evidence`).

Pure data: nothing here emits, reads a clock or knows where the numbers came from; category,
severity, action and the summary's words are the catalog's, never written here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from denpex.core.detectors import detector, detector_evidence
from denpex.core.events import Event, Evidence


@dataclass(frozen=True, slots=True)
class Finding:
    """What a detector saw. `signature` is a detector id (DESIGN §3: evidence not produced by
    a signature regex); `captures` stay on the evidence, `values` only fill in its summary;
    `severity`/`action` are given only by a detector whose catalog entry says what `varies`."""

    signature: str
    captures: dict[str, str] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    severity: str | None = None
    action: str | None = None

    @property
    def category(self) -> str:
        return detector(self.signature).category

    @property
    def summary(self) -> str:
        """The sentence the evidence will carry (the catalog's template, filled in)."""
        return detector(self.signature).render({**self.captures, **self.values})

    def evidence(
        self, event: Event, evidence_id: str, extra_captures: dict[str, str] | None = None
    ) -> Evidence:
        """This finding as Evidence about `event` (whose body becomes the summary), with the
        caller's id and any captures the caller knows (rank, host, device) before its own."""
        evidence = detector_evidence(
            event,
            self.signature,
            captures={**(extra_captures or {}), **self.captures},
            values=self.values,
            severity=self.severity,
            action=self.action,
        )
        evidence.id = evidence_id
        event.body = evidence.summary
        return evidence


def fmt(value: float) -> str:
    """A number as findings print it: six significant digits, nan/inf as Python spells them."""
    return f"{value:.6g}"
