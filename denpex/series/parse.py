"""The numbers training jobs print, read from one log line: step, loss, grad norm, loss scale,
learning rate, step time, throughput, skipped steps.

Formats, as their frameworks write them: Hugging Face Trainer dicts (`{'loss': 2.31,
'grad_norm': …}`, floats as '.4g' strings since v4.5x), Megatron-LM iteration lines
(` iteration  100/ 5000 | … | lm loss: 2.3E+00 | loss scale: 4096.0 | …`), DeepSpeed
(`[Rank 0] step=10, skipped=0, lr=[…], mom=[…]` and its throughput timer
`…/global_step=10, RunningAvgSamplesPerSec=…, CurrSamplesPerSec=…`), Lightning progress bars
(`… 40/1095 [00:03<01:37, 10.84it/s, v_num=10, train_loss=2.310]`), fairseq (`epoch 001:
100 / 1000 loss=9.1, …, wps=…` , `epoch 001 | loss 9.1 | … | wps …` and its JSON lines),
CLU/t5x metric writers (`[1000] timing/steps_per_second=3.4, train/loss=2.3`), Keras
progress (`100/1000 [==>…] - ETA: 1:23 - loss: 0.2345`, `12ms/step`) and plain `loss=`,
`loss:` and `loss 4.2` key-values. Pure: bytes in, numbers out; it never raises on any input
and reads at most the first PARSE_LIMIT bytes of a line (of a progress bar redrawn with
carriage returns, the last state in them).

This module holds the tables (which keys mean what) and the StepNumbers they fill; the
reading itself is denpex._native.stepnumbers, compiled, or its regex twin stepnumbers_ref.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import denpex._native as native

PARSE_LIMIT = 4096
# a line is only parsed when it holds one of these (callers test a whole batch first)
LITERALS = (b"loss", b"Loss", b"step=", b"per_second", b"SamplesPerSec")
LITERAL_SEARCH = re.compile(b"|".join(re.escape(literal) for literal in LITERALS))

# canonical keys, most specific first; keys are compared lowercased with single spaces
LOSS_KEYS = (
    "loss", "lm loss", "train_loss", "train/loss", "train_loss_step", "loss_step", "train loss",
    "training_loss", "train/total_loss", "total_loss", "lm_loss",
)  # fmt: skip
GRAD_NORM_KEYS = ("grad_norm", "grad norm", "gnorm", "train/grad_norm", "gradient_norm")
LOSS_SCALE_KEYS = ("loss scale", "loss_scale", "train/loss_scale")
LR_KEYS = ("lr", "learning_rate", "learning rate", "train/learning_rate", "train/lr")
STEP_KEYS = (
    "global_step", "num_updates", "step", "iteration", "iter", "train/step", "trainer/global_step",
    "completed step",
)  # fmt: skip
STEP_TIME_KEYS = {  # key -> seconds per unit of the printed value
    "elapsed time per iteration (ms)": 1e-3,
    "step_time": 1.0,
    "step time": 1.0,
    "time_per_step": 1.0,
    "iter_time": 1.0,
    "seconds_per_step": 1.0,
    "timing/seconds_per_step": 1.0,
}
THROUGHPUT_KEYS = {  # key -> unit
    "currsamplespersec": "samples/s",
    "samples_per_second": "samples/s",
    "timing/steps_per_second": "steps/s",
    "steps_per_second": "steps/s",
    "timing/seqs_per_second": "seqs/s",
    "tokens_per_second": "tokens/s",
    "wps": "words/s",
    "ups": "updates/s",
    "throughput per gpu (tflop/s/gpu)": "TFLOP/s/GPU",
    "runningavgsamplespersec": "samples/s",
}
_UNIT_SECONDS = {"ms": 1e-3, "us": 1e-6, "µs": 1e-6, "s": 1.0}
# lines that summarise a whole run or an evaluation, not one training step
_SUMMARY_KEYS = ("train_runtime", "eval_loss", "eval_runtime")


class StepNumbers(NamedTuple):
    """What one line says about training. `step` is the global step when the line states one;
    `skipped` counts the steps the loss scaler skipped in this logging interval,
    `skipped_total` since the start (DeepSpeed's `skipped=`). A named tuple: one is made per
    parsed line, in a seventh of a frozen dataclass's time."""

    format: str
    step: int | None = None
    total_steps: int | None = None
    epoch: float | None = None
    loss: float | None = None
    grad_norm: float | None = None
    loss_scale: float | None = None
    lr: float | None = None
    step_time_s: float | None = None
    throughput: float | None = None
    throughput_unit: str | None = None
    skipped: int | None = None
    skipped_total: int | None = None
    rank: int | None = None

    @property
    def has_numbers(self) -> bool:
        return any(
            v is not None
            for v in (self.loss, self.grad_norm, self.loss_scale, self.step_time_s, self.throughput)
        )


def wants(data: bytes) -> bool:
    """Whether `data` (a line or a batch of lines) holds anything parse_numbers reads."""
    if len(data) <= PARSE_LIMIT:  # a line: one search beats a `bytes.find` per literal
        return LITERAL_SEARCH.search(data) is not None
    return any(literal in data for literal in LITERALS)  # a batch: memchr-fast finds


def parse_numbers(line: bytes) -> StepNumbers | None:
    """The training numbers of one line, or None when it states none."""
    if not wants(line[:PARSE_LIMIT]):
        return None
    return parse_candidate(line)


def parse_candidate(line: bytes) -> StepNumbers | None:
    """parse_numbers for a line already known to hold a literal (denpex.series.sampling)."""
    fields = _PARSER.parse(line)
    return None if fields is None else StepNumbers._make(fields)


# chosen once, at import: parse_candidate runs for every candidate line of a scan
_PARSER = native.load("stepnumbers").StepParser(
    LOSS_KEYS,
    GRAD_NORM_KEYS,
    LOSS_SCALE_KEYS,
    LR_KEYS,
    STEP_KEYS,
    STEP_TIME_KEYS,
    THROUGHPUT_KEYS,
    _UNIT_SECONDS,
    _SUMMARY_KEYS,
    PARSE_LIMIT,
)
