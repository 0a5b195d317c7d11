"""Loss findings of a training loop that reports only its loss (JAX, Keras): the same NaN and
spike rules as dx.watch and the log scanner (denpex.series), each finding sent once as SDK
evidence for this rank.

It never raises into the loop: an emit that fails is logged at debug level and dropped.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from denpex.core.events import Event, Evidence
from denpex.series.findings import Finding
from denpex.series.loss import LossSpikeDetector, NonFiniteLoss, nan_finding
from denpex.series.thresholds import LossRules, with_options

log = logging.getLogger("denpex.sdk")
Emit = Callable[[Evidence | Event], None]


def process_state_event(host: str, rank: int | None) -> Event:
    """The SDK state event a finding of this training process is evidence about (now)."""
    return Event(
        body="",
        ts_ns=time.time_ns(),
        host=host,
        source="sdk",
        kind="state",
        rank=rank,
        pid=os.getpid(),
    )


class StepFindings:
    """One per training process: `loss(step, value)` on the steps the loss is read,
    `send_once(key, finding)` for any other finding of this rank (`source` names the
    integration in evidence ids: sdk-<source>-<host>-<pid>-<key>)."""

    def __init__(
        self,
        *,
        rank: int,
        source: str,
        emit: Emit | None = None,
        options: Mapping[str, Any] | None = None,
        host: str | None = None,
    ) -> None:
        self.rank, self.source = rank, source
        self.host = host or socket.gethostname()
        self._emit = emit
        self._reported: set[str] = set()
        rules = with_options(LossRules, dict(options or {}))
        self._nan, self._spikes = NonFiniteLoss(rules), LossSpikeDetector(rules)

    def loss(self, step: int, loss: float) -> None:
        """Judge one loss value; a NaN episode and a spike are each reported once."""
        episode = self._nan.observe(step, loss)
        found = [nan_finding(episode)] if episode is not None else []
        spike = self._spikes.observe(step, loss) if math.isfinite(loss) else None
        found += [spike] if spike is not None else []
        for finding in found:
            self.send_once(
                f"{finding.signature}:{self.rank}:{finding.captures.get('step')}",
                Finding(
                    finding.signature,
                    captures={"rank": str(self.rank), **finding.captures},
                    values=finding.values,
                ),
            )

    def send_once(self, key: str, finding: Finding) -> None:
        if key in self._reported:
            return
        self._reported.add(key)
        event = process_state_event(self.host, self.rank)
        evidence = finding.evidence(event, f"sdk-{self.source}-{self.host}-{os.getpid()}-{key}")
        try:
            if self._emit is not None:
                self._emit(evidence)
            else:
                from denpex.sdk.transport import default_emit

                default_emit(evidence)
        except Exception as exc:
            log.debug("dx.%s: emit failed: %s", self.source, exc)
