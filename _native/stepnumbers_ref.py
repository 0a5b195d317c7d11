"""The training numbers of one log line, read with regexes: the pure-Python twin of
`denpex._native.stepnumbers`, its test oracle, and what `denpex._native.load("stepnumbers")`
returns when the extension is not built.

The key tables are data and stay with denpex.series.parse, which builds one StepParser from
them; this module holds only the algorithm and must never import denpex.series (the native
layer is the lowest). `StepParser.parse` never raises on any bytes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

# the fields of denpex.series.parse.StepNumbers, in its order: format, step, total_steps, epoch,
# loss, grad_norm, loss_scale, lr, step_time_s, throughput, throughput_unit, skipped,
# skipped_total, rank
Fields = tuple[
    str,
    int | None,
    int | None,
    float | None,
    float | None,
    float | None,
    float | None,
    float | None,
    float | None,
    float | None,
    str | None,
    int | None,
    int | None,
    int | None,
]
Pairs = dict[str, tuple[float, str | None]]

# case variants spelled out: a scoped (?i:…) disables the engine's first-character check and
# makes every pattern holding it several times slower
_NUM = (
    r"[-+]?(?:\d{1,20}(?:\.\d{0,20})?|\.\d{1,20})(?:[eE][-+]?\d{1,3})?"
    r"|[-+]?(?:nan|NaN|NAN|inf|Inf|INF|infinity|Infinity|INFINITY)"
)
_UNIT = r"(?P<unit>ms|us|µs|s)?"
UNITS = ("ms", "us", "µs", "s")  # the units _UNIT and _PER_STEP read, each needs its seconds
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


class StepParser:
    """Reads lines with the key tables it is given (keys compared lowercased, with single
    spaces; the first occurrence of a key in a line wins). `parse(line)` gives the fields of a
    StepNumbers, or None when the line states no training numbers."""

    def __init__(
        self,
        loss_keys: Iterable[str],
        grad_norm_keys: Iterable[str],
        loss_scale_keys: Iterable[str],
        lr_keys: Iterable[str],
        step_keys: Iterable[str],
        step_time_keys: Mapping[str, float],
        throughput_keys: Mapping[str, str],
        unit_seconds: Mapping[str, float],
        summary_keys: Iterable[str],
        parse_limit: int,
    ) -> None:
        if parse_limit < 0:
            raise ValueError("parse_limit must be at least 0 bytes")
        self._loss_keys = tuple(loss_keys)
        self._grad_norm_keys = tuple(grad_norm_keys)
        self._loss_scale_keys = tuple(loss_scale_keys)
        self._lr_keys = tuple(lr_keys)
        self._step_keys = tuple(step_keys)
        self._step_time_keys = dict(step_time_keys)
        self._throughput_keys = dict(throughput_keys)
        self._unit_seconds = dict(unit_seconds)
        missing = [unit for unit in UNITS if unit not in self._unit_seconds]
        if missing:
            raise ValueError(f"unit_seconds lacks {', '.join(missing)}")
        self._summary_keys = tuple(summary_keys)
        self.parse_limit = parse_limit
        self.fallbacks = 0  # lines the compiled parser hands to this twin; none here

    def parse(self, line: bytes) -> Fields | None:
        """The StepNumbers fields of one line already known to hold a literal."""
        head = line[: self.parse_limit]
        if b"\r" in head:  # a progress bar redrawn in place: its last state is what it says now
            head = head.rstrip(b"\r").rpartition(b"\r")[2]
        text = head.decode("utf-8", "replace")
        pairs: Pairs = {}
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
        if any(key in pairs for key in self._summary_keys):
            return None
        return self._numbers(text, pairs)

    def _numbers(self, text: str, pairs: Pairs) -> Fields | None:
        fmt = _format(text)
        step = total = None
        megatron = _MEGATRON_ITER.search(text) if "iteration" in text else None
        if megatron:
            step, total = int(megatron.group(1)), int(megatron.group(2))
        if step is None:
            step = _count(_first(pairs, self._step_keys))
        if step is None and "[" in text:
            clu = _CLU_STEP.search(text)
            step = int(clu.group(1)) if clu else None
        epoch = _first(pairs, ("epoch",))
        throughput, throughput_unit = self._throughput(text, pairs)
        loss = _first(pairs, self._loss_keys)
        grad_norm = _first(pairs, self._grad_norm_keys)
        loss_scale = _first(pairs, self._loss_scale_keys)
        step_time_s = self._step_time(text, pairs)
        skipped_total = _count(_first(pairs, ("skipped",)))
        fields: Fields = (
            fmt,
            step,
            total,
            epoch if epoch is not None and math.isfinite(epoch) else None,
            loss,
            grad_norm,
            loss_scale,
            _first(pairs, self._lr_keys),
            step_time_s,
            throughput,
            throughput_unit,
            _count(_first(pairs, ("number of skipped iterations",))),
            skipped_total,
            _rank(text),
        )
        has_numbers = any(
            v is not None for v in (loss, grad_norm, loss_scale, step_time_s, throughput)
        )
        if has_numbers or skipped_total is not None:
            return fields
        if step is not None and fmt not in ("plain", "keras", "lightning"):
            return fields  # a step alone says training progressed (DeepSpeed's step= lines)
        return None

    def _step_time(self, text: str, pairs: Pairs) -> float | None:
        for key, scale in self._step_time_keys.items():
            if key in pairs:
                value, unit = pairs[key]
                return value * (self._unit_seconds[unit] if unit else scale)
        if "time" in pairs and pairs["time"][1]:  # `time 123.45ms`: only with its unit
            value, unit = pairs["time"]
            return value * self._unit_seconds[unit or "s"]
        per_step = _PER_STEP.search(text) if "/step" in text else None  # Keras `12ms/step`
        if per_step:
            return float(per_step.group(1)) * self._unit_seconds[per_step.group(2)]
        rate = _RATE.search(text) if "s/it" in text else None
        if rate and rate.group("rate") == "s/it":  # tqdm's slow form: seconds per iteration
            try:
                return float(rate.group("val"))
            except ValueError:
                return None
        return None

    def _throughput(self, text: str, pairs: Pairs) -> tuple[float | None, str | None]:
        """(throughput, its unit): a known key, else tqdm's `it/s` rate."""
        for key, unit in self._throughput_keys.items():
            if key in pairs:
                return pairs[key][0], unit
        rate = _RATE.search(text) if "it/s" in text else None
        if rate and rate.group("rate") == "it/s":
            try:
                return float(rate.group("val")), "it/s"
            except ValueError:
                pass
        return None, None


def _other_split(text: str, key_at: int) -> bool:
    """Whether the key at `key_at` is another split's (`val loss`)."""
    return _OTHER_SPLIT.search(text, max(0, key_at - 12), key_at) is not None


def _segment(pairs: Pairs, segment: str) -> None:
    """`key: value` or `key value` filling one segment, the value last."""
    head, _, tail = segment.strip().rpartition(" ")
    key = head.rstrip(" \t:")
    if not key or not _SEGMENT_KEY.fullmatch(key):
        return
    found = _VALUE.fullmatch(tail)
    if found:
        _put(pairs, key, found.group("val"), found.group("unit"))


def _put(pairs: Pairs, key: str, value: str, unit: str | None) -> None:
    key = " ".join(key.lower().split())
    if key in pairs:
        return
    try:
        number = float(value)
    except ValueError:
        return
    pairs[key] = (number, unit)


def _first(pairs: Pairs, keys: tuple[str, ...]) -> float | None:
    for key in keys:
        if key in pairs:
            return pairs[key][0]
    return None


def _count(value: float | None) -> int | None:
    if value is None or not math.isfinite(value) or value < 0 or value != int(value):
        return None
    return int(value)


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
