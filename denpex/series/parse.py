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
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

PARSE_LIMIT = 4096
# a line is only parsed when it holds one of these (callers test a whole batch first)
LITERALS = (b"loss", b"Loss", b"step=", b"per_second", b"SamplesPerSec")

# case variants spelled out: a scoped (?i:…) disables the engine's first-character check and
# makes every pattern holding it several times slower
_NUM = (
    r"[-+]?(?:\d{1,20}(?:\.\d{0,20})?|\.\d{1,20})(?:[eE][-+]?\d{1,3})?"
    r"|[-+]?(?:nan|NaN|NAN|inf|Inf|INF|infinity|Infinity|INFINITY)"
)
_UNIT = r"(?P<unit>ms|us|µs|s)?"
# a loss of another split is not the training loss: `val loss: 2.3`, `eval loss 2.1` (the word
# before a key is checked in Python: eight lookbehinds at every position cost more than the rest)
_OTHER_SPLIT = re.compile(r"(?:^|[^\w])(?:val|eval|valid|test|best|dev|validation)[ \t]$", re.I)
_SPLIT_WORDS = ("val", "test", "best", "dev")  # each word of _OTHER_SPLIT holds one of these
# `key=value` / `key: value` / `'key': 'value'` / `"key": value` with a key without spaces (the
# key's repeat is possessive: a word that is not followed by a separator fails at once)
_KV = re.compile(
    r"(?<![\w.\-])(?P<q>['\"]?)(?P<key>[A-Za-z_][\w/.\-]{0,63}+)(?P=q)[ \t]{0,4}+[:=][ \t]{0,16}+"
    rf"['\"]?\[?(?P<val>{_NUM}){_UNIT}(?![\w.])"
)
# the value ending one `|`-separated segment (Megatron `lm loss: 2.3E+00`, fairseq `loss 9.1`)
_VALUE = re.compile(rf"(?P<val>{_NUM}){_UNIT}")
_SEGMENT_KEY = re.compile(r"[A-Za-z][\w /.()\-]{0,63}")
# a few keys people print without a separator: nanoGPT `iter 100: loss 4.2341, time 12.3ms`
# (the lookahead, the keys' first letters, changes no match: it fails at once where no key can
# start, where `\b` and eight alternatives were tried at every position of the line)
_PLAIN = re.compile(
    r"(?=[LlIiSsEeTt])"
    rf"\b(?P<key>[Ll]oss|LOSS|[Ii]ter|[Ss]tep|[Ee]poch|lr|LR|[Tt]ime)[ \t]{{1,8}}+"
    rf"(?P<val>{_NUM}){_UNIT}(?![\w.])"
)
_MEGATRON_ITER = re.compile(
    r"(?=i)\biteration[ \t]{1,16}(\d{1,12})[ \t]{0,8}/[ \t]{0,12}(\d{1,12})[ \t]{0,4}\|"
)
_FAIRSEQ_EPOCH = re.compile(r"\bepoch (\d{1,6}):[ \t]{1,12}(\d{1,12}) / (\d{1,12})\b")
_FAIRSEQ_PRINT = re.compile(r"(?:^|\| )epoch \d{1,6} \|")
_CLU_STEP = re.compile(
    r"(?:^|\] )\[(\d{1,12})\](?: collection=[\w/.\-]{1,64})? [A-Za-z_][\w/.\-]{0,63}="
)
_BAR_PROGRESS = re.compile(r"(?<![\w/.])(\d{1,9})/(\d{1,9}) (?:\[|━)")
_RATE = re.compile(rf"(?<![\w.])(?P<val>{_NUM}) ?(?P<rate>it/s|s/it)\b")
_PER_STEP = re.compile(r"(?<![\w.])(\d{1,9}(?:\.\d{1,9})?)(ms|us|µs|s)/step\b")
_DS_RANK = re.compile(r"\[Rank (\d{1,7})\]")

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


@dataclass(frozen=True, slots=True)
class StepNumbers:
    """What one line says about training. `step` is the global step when the line states one;
    `skipped` counts the steps the loss scaler skipped in this logging interval,
    `skipped_total` since the start (DeepSpeed's `skipped=`)."""

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
    return any(literal in data for literal in LITERALS)


def parse_numbers(line: bytes) -> StepNumbers | None:
    """The training numbers of one line, or None when it states none."""
    if not wants(line[:PARSE_LIMIT]):
        return None
    return parse_candidate(line)


def parse_candidate(line: bytes) -> StepNumbers | None:
    """parse_numbers for a line already known to hold a literal (denpex.series.sampling)."""
    head = line[:PARSE_LIMIT]
    if b"\r" in head:  # a progress bar redrawn in place: its last state is what it says now
        head = head.rstrip(b"\r").rpartition(b"\r")[2]
    text = head.decode("utf-8", "replace")
    pairs: dict[str, tuple[float, str | None]] = {}
    if text.count("|") >= 2:
        for segment in text.split("|"):
            _segment(pairs, segment)
    lowered = text.lower()
    other_splits = any(word in lowered for word in _SPLIT_WORDS)
    if "=" in text or ":" in text:
        for found in _KV.finditer(text):
            if not (other_splits and _other_split(text, found.start())):
                _put(pairs, found.group("key"), found.group("val"), found.group("unit"))
    for found in _PLAIN.finditer(text):
        if text[found.start() - 1 : found.start()] not in ("/", ".", "-", "_") and not (
            other_splits and _other_split(text, found.start())
        ):
            _put(pairs, found.group("key"), found.group("val"), found.group("unit"))
    if any(key in pairs for key in _SUMMARY_KEYS):
        return None
    return _numbers(text, pairs)


def _other_split(text: str, key_at: int) -> bool:
    """Whether the key at `key_at` is another split's (`val loss`)."""
    return _OTHER_SPLIT.search(text, max(0, key_at - 12), key_at) is not None


def _segment(pairs: dict[str, tuple[float, str | None]], segment: str) -> None:
    """`key: value` or `key value` filling one segment, the value last."""
    head, _, tail = segment.strip().rpartition(" ")
    key = head.rstrip(" \t:")
    if not key or not _SEGMENT_KEY.fullmatch(key):
        return
    found = _VALUE.fullmatch(tail)
    if found:
        _put(pairs, key, found.group("val"), found.group("unit"))


def _put(
    pairs: dict[str, tuple[float, str | None]], key: str, value: str, unit: str | None
) -> None:
    key = " ".join(key.lower().split())
    if key in pairs:
        return
    try:
        number = float(value)
    except ValueError:
        return
    pairs[key] = (number, unit)


def _first(pairs: dict[str, tuple[float, str | None]], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        if key in pairs:
            return pairs[key][0]
    return None


def _count(value: float | None) -> int | None:
    if value is None or not math.isfinite(value) or value < 0 or value != int(value):
        return None
    return int(value)


def _numbers(text: str, pairs: dict[str, tuple[float, str | None]]) -> StepNumbers | None:
    fmt = _format(text)
    step = total = None
    megatron = _MEGATRON_ITER.search(text) if "iteration" in text else None
    if megatron:
        step, total = int(megatron.group(1)), int(megatron.group(2))
    if step is None:
        step = _count(_first(pairs, STEP_KEYS))
    if step is None and "[" in text:
        clu = _CLU_STEP.search(text)
        step = int(clu.group(1)) if clu else None
    epoch = _first(pairs, ("epoch",))
    throughput, throughput_unit = _throughput(text, pairs)
    numbers = StepNumbers(
        format=fmt,
        step=step,
        total_steps=total,
        epoch=epoch if epoch is not None and math.isfinite(epoch) else None,
        loss=_first(pairs, LOSS_KEYS),
        grad_norm=_first(pairs, GRAD_NORM_KEYS),
        loss_scale=_first(pairs, LOSS_SCALE_KEYS),
        lr=_first(pairs, LR_KEYS),
        step_time_s=_step_time(text, pairs),
        skipped=_count(_first(pairs, ("number of skipped iterations",))),
        skipped_total=_count(_first(pairs, ("skipped",))),
        throughput=throughput,
        throughput_unit=throughput_unit,
        rank=_rank(text),
    )
    if numbers.has_numbers or numbers.skipped_total is not None:
        return numbers
    if step is not None and fmt not in ("plain", "keras", "lightning"):
        return numbers  # a step alone says training progressed (DeepSpeed's step= lines)
    return None


def _step_time(text: str, pairs: dict[str, tuple[float, str | None]]) -> float | None:
    for key, scale in STEP_TIME_KEYS.items():
        if key in pairs:
            value, unit = pairs[key]
            return value * (_UNIT_SECONDS[unit] if unit else scale)
    if "time" in pairs and pairs["time"][1]:  # `time 123.45ms`: only with its unit
        value, unit = pairs["time"]
        return value * _UNIT_SECONDS[unit or "s"]
    per_step = _PER_STEP.search(text) if "/step" in text else None  # Keras `12ms/step`
    if per_step:
        return float(per_step.group(1)) * _UNIT_SECONDS[per_step.group(2)]
    rate = _RATE.search(text) if "s/it" in text else None
    if rate and rate.group("rate") == "s/it":  # tqdm's slow form: seconds per iteration
        try:
            return float(rate.group("val"))
        except ValueError:
            return None
    return None


def _throughput(
    text: str, pairs: dict[str, tuple[float, str | None]]
) -> tuple[float | None, str | None]:
    """(throughput, its unit): a known key, else tqdm's `it/s` rate."""
    for key, unit in THROUGHPUT_KEYS.items():
        if key in pairs:
            return pairs[key][0], unit
    rate = _RATE.search(text) if "it/s" in text else None
    if rate and rate.group("rate") == "it/s":
        try:
            return float(rate.group("val")), "it/s"
        except ValueError:
            pass
    return None, None


def _rank(text: str) -> int | None:
    found = _DS_RANK.search(text) if "[Rank " in text else None
    return int(found.group(1)) if found else None


def _format(text: str) -> str:
    """Which framework wrote the line (as far as its shape tells)."""
    if "iteration" in text and _MEGATRON_ITER.search(text):
        return "megatron"
    if "SamplesPerSec=" in text:
        return "deepspeed_timer"
    if "skipped=" in text and "step=" in text:
        return "deepspeed"
    stripped = text.lstrip()
    if "{'" in text:
        return "hf"
    if '{"' in text:
        return "json"
    if "epoch " in text and (_FAIRSEQ_EPOCH.search(text) or _FAIRSEQ_PRINT.search(stripped)):
        return "fairseq"
    if "[" in text and _CLU_STEP.search(text):
        return "clu"
    if "v_num=" in text or "it/s" in text or "s/it" in text:
        return "lightning"
    if "/step" in text or " - loss: " in text or ("/" in text and _BAR_PROGRESS.search(text)):
        return "keras"
    return "plain"
