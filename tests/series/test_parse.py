"""The numbers of one log line, in the formats frameworks print (as their sources write them:
transformers' ProgressCallback/PrinterCallback, Megatron's training_log, DeepSpeed's
_report_progress and ThroughputTimer, Lightning's tqdm bar, fairseq's progress bars, CLU's
LoggingWriter, Keras' Progbar), and property tests that the parser never raises."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from denpex.series.parse import LITERALS, StepNumbers, parse_numbers, wants

HYPOTHESIS_SEED = 20261201

MEGATRON = (
    b" [2024-05-01 10:00:00] iteration      100/    5000 | consumed samples:        51200 |"
    b" elapsed time per iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 123.4 |"
    b" learning rate: 1.000000E-04 | global batch size:   512 | lm loss: 2.345678E+00 |"
    b" loss scale: 4096.0 | grad norm: 1.234 | number of skipped iterations:   2 |"
    b" number of nan iterations:   0 |"
)

CASES = [
    (MEGATRON, dict(format="megatron", step=100, total_steps=5000, loss=2.345678,
                    loss_scale=4096.0, grad_norm=1.234, lr=1e-4, step_time_s=1.2345, skipped=2)),
    (b" iteration     5426/  250000 | learning rate: 2.999E-04 | lm loss: NAN | loss scale: 1.0 |"
     b" grad norm: nan | number of skipped iterations:   0 |",
     dict(format="megatron", step=5426, loss=math.nan, grad_norm=math.nan, loss_scale=1.0)),
    (b"[2023-08-02 00:41:17,526] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=3,"
     b" lr=[0.0001], mom=[(0.9, 0.999)]",
     dict(format="deepspeed", step=10, skipped_total=3, lr=1e-4, rank=0)),
    (b"[2023-08-02 00:41:17,526] [INFO] [timer.py:260:stop] epoch=0/micro_step=10/global_step=10,"
     b" RunningAvgSamplesPerSec=12.34, CurrSamplesPerSec=12.5, MemAllocated=1.2GB,"
     b" MaxMemAllocated=3.4GB",
     dict(format="deepspeed_timer", step=10, throughput=12.5, throughput_unit="samples/s")),
    (b"{'loss': '2.31', 'grad_norm': '1.234', 'learning_rate': '4.9e-05', 'epoch': '0.01'}",
     dict(format="hf", step=None, loss=2.31, grad_norm=1.234, lr=4.9e-05, epoch=0.01)),
    (b"{'loss': 2.3101, 'grad_norm': 1.2345, 'learning_rate': 4.9e-05, 'epoch': 0.01}",
     dict(format="hf", loss=2.3101, grad_norm=1.2345)),
    (b"{'loss': nan, 'grad_norm': nan, 'learning_rate': 4.9e-05, 'epoch': 0.5}",
     dict(format="hf", loss=math.nan)),
    (b"Epoch 1:   4%|\xe2\x96\x8e         | 40/1095 [00:03<01:37, 10.84it/s, v_num=10,"
     b" train_loss=2.310]",
     dict(format="lightning", loss=2.31, throughput=10.84, throughput_unit="it/s")),
    (b"Epoch 0:  12%|#2  | 12/100 [00:31<03:48,  2.60s/it, loss=4.12, v_num=3]",
     dict(format="lightning", loss=4.12, step_time_s=2.6)),
    (b"2021-03-08 12:34:45 | INFO | train_inner | epoch 001:    100 / 1000 loss=9.123,"
     b" nll_loss=8.5, ppl=362.1, wps=12345.6, ups=1.2, wpb=10240, bsz=32, num_updates=100,"
     b" lr=1e-05, gnorm=1.23, loss_scale=4, train_wall=12, gb_free=10.2, wall=34",
     dict(format="fairseq", step=100, loss=9.123, grad_norm=1.23, loss_scale=4.0,
          throughput=12345.6, throughput_unit="words/s")),
    (b"| epoch 001 | loss 9.123 | nll_loss 8.5 | ppl 362 | wps 12345 | ups 1.2 |"
     b" num_updates 1000 | lr 1e-05 | gnorm 1.23 | loss_scale 4 | wall 123",
     dict(format="fairseq", step=1000, loss=9.123, loss_scale=4.0, epoch=1.0)),
    (b'2021-03-08 12:34:45 | INFO | train_inner | {"epoch": 1, "update": 0.001, "loss": "25.22",'
     b' "loss_scale": "4", "num_updates": "100", "wps": "1234"}',
     dict(format="json", step=100, loss=25.22, loss_scale=4.0, throughput=1234.0)),
    (b"I1130 04:56:09.123456 140000 logging_writer.py:48] [1000] learning_rate=0.001,"
     b" timing/steps_per_second=3.4, train/loss=2.345",
     dict(format="clu", step=1000, loss=2.345, lr=0.001, throughput=3.4)),
    (b"100/1000 [==>...........................] - ETA: 1:23 - loss: 0.2345 - accuracy: 0.9100",
     dict(format="keras", loss=0.2345)),
    (b"1000/1000 \xe2\x94\x81\xe2\x94\x81\xe2\x94\x81 12s 12ms/step - accuracy: 0.9000 -"
     b" loss: 0.2000 - val_loss: 0.3000",
     dict(format="keras", loss=0.2, step_time_s=0.012)),
    (b"iter 100: loss 4.2341, time 123.45ms, mfu 12.30%",
     dict(format="plain", step=100, loss=4.2341, step_time_s=0.12345)),
    (b"step 0, loss: 10.899394989013672", dict(format="plain", step=0, loss=10.899394989013672)),
    (b"Step 1200 | Loss: 2.31 | grad_norm=0.98", dict(step=1200, loss=2.31, grad_norm=0.98)),
    (b"Epoch 3: val loss: 2.31, train loss: 2.1", dict(loss=2.1)),
]  # fmt: skip

NOT_TRAINING = [
    b"{'train_runtime': 12.3, 'train_samples_per_second': 4.5, 'train_loss': 2.1, 'epoch': 3.0}",
    b"{'eval_loss': 2.1, 'eval_runtime': 1.2, 'epoch': 1.0}",
    b"epoch 0 | best_val_loss: inf | val_loss: 2.8812",
    b" validation loss at iteration 100 | lm loss value: 2.311E+00 | lm loss PPL: 1.008E+01 |",
    b"Loss is nan, stopping training",  # a message, not a number printed as a metric
    b"the loss function is cross entropy",
    b"torch.nan_to_num(loss) applied",
]


def close(a: float | None, b: float) -> bool:
    return a is not None and (math.isnan(a) if math.isnan(b) else a == pytest.approx(b))


@pytest.mark.parametrize(("line", "want"), CASES, ids=lambda v: str(v)[:40])
def test_each_framework_format(line, want):
    got = parse_numbers(line)
    assert got is not None
    for name, value in want.items():
        have = getattr(got, name)
        if isinstance(value, float):
            assert close(have, value), (name, have, value)
        else:
            assert have == value, (name, have, value)


@pytest.mark.parametrize("line", NOT_TRAINING, ids=lambda v: str(v)[:40])
def test_summaries_evaluations_and_messages_are_not_a_training_loss(line):
    got = parse_numbers(line)
    assert got is None or got.loss is None


def test_only_lines_with_a_literal_are_read():
    assert parse_numbers(b"iteration 100/ 5000 | lr: 3e-4 |") is None
    assert not wants(b"nothing here") and wants(b"x loss=1")


def test_the_parse_is_bounded_to_the_start_of_a_huge_line():
    line = b"step=5, loss=2.0 " + b"x" * (1 << 20) + b" grad_norm=3"
    got = parse_numbers(line)
    assert got is not None and got.loss == 2.0 and got.grad_norm is None


def test_a_bar_redrawn_with_carriage_returns_is_read_at_its_last_state():
    bar = b"\r".join(
        b"Epoch 0:  %d%%|##  | %d/100 [00:0%d<00:10, 9.5it/s, loss=%d.5, v_num=3]" % (k, k, k, k)
        for k in range(1, 8)
    )
    got = parse_numbers(bar + b"\r")
    assert got is not None and got.loss == 7.5 and got.throughput == 9.5


printable_lines = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300).map(
    lambda text: text.encode("utf-8", "replace")
)
pieces = st.sampled_from(
    [b"loss", b"Loss", b"=", b": ", b"'", b'"', b"|", b" ", b"nan", b"-inf", b"1e+", b"2.5",
     b"step=", b"iteration 3/", b"[", b"]", b"{", b"}", b"ms", b"/step", b"it/s", b"s/it",
     b"lm loss: ", b"loss scale: ", b"skipped=", b"per_second=", b"SamplesPerSec=", b"\xff",
     b"\x00", b"9" * 30, b".", b"E", b"-", b"_", b"val "]
)  # fmt: skip
glued = st.lists(pieces, max_size=40).map(b"".join)


@hypothesis_seed(HYPOTHESIS_SEED)
@settings(max_examples=600, deadline=None)
@given(line=st.one_of(st.binary(max_size=400), printable_lines, glued))
@example(line=b"loss=" + b"9" * 400)
@example(line=b"loss: 1e999 | loss scale: -0 | step=1e5")
def test_never_raises_and_returns_numbers_or_none(line):
    print("hypothesis seed", HYPOTHESIS_SEED)
    got = parse_numbers(line)
    assert got is None or isinstance(got, StepNumbers)
    if got is not None:
        assert any(literal in line for literal in LITERALS)
        for count in (got.step, got.skipped, got.skipped_total, got.total_steps):
            assert count is None or (isinstance(count, int) and count >= 0)


@hypothesis_seed(HYPOTHESIS_SEED)
@settings(max_examples=300, deadline=None)
@given(
    value=st.floats(allow_nan=True, allow_infinity=True, width=32),
    prefix=st.sampled_from([b"", b"[rank3]: ", b"2026-11-30 04:56:09 | INFO | "]),
    sep=st.sampled_from([b"=", b": ", b" "]),
)
def test_a_plain_loss_key_value_round_trips(value, prefix, sep):
    print("hypothesis seed", HYPOTHESIS_SEED)
    text = repr(float(value)).encode()
    got = parse_numbers(prefix + b"step 7, loss" + sep + text + b", lr=0.1")
    assert got is not None and got.step == 7
    assert close(got.loss, float(value))
