"""The step-numbers parser: the compiled StepParser gives exactly what its regex twin gives, on
every line of the log corpora and of the benchmarks' corpus, on hypothesis lines built from the
grammar's pieces (keys, separators, every number form, units, rates, the frameworks' shapes,
carriage returns, Unicode letters, digits and spaces, invalid UTF-8, lines past the parse limit)
and on random bytes; and its C scan, not the twin, reads every line it can (`fallbacks`)."""

from __future__ import annotations

import math
import re
import unicodedata
from types import ModuleType

import pytest
from hypothesis import example, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from denpex._native import stepnumbers_ref
from denpex.series import parse
from tests.native.native_support import bench_lines, corpus_lines, native_module

HYPOTHESIS_SEED = 20261203
TABLES = (
    parse.LOSS_KEYS,
    parse.GRAD_NORM_KEYS,
    parse.LOSS_SCALE_KEYS,
    parse.LR_KEYS,
    parse.STEP_KEYS,
    parse.STEP_TIME_KEYS,
    parse.THROUGHPUT_KEYS,
    parse._UNIT_SECONDS,
    parse._SUMMARY_KEYS,
)
SHORT_LIMIT = 61  # a second pair of parsers, so that hypothesis lines cross the limit often


def parsers(module: ModuleType, limit: int = parse.PARSE_LIMIT):
    return module.StepParser(*TABLES, limit)


@pytest.fixture(scope="module")
def native() -> ModuleType:
    return native_module("stepnumbers")


def comparable(fields):
    """Fields with their types and float reprs (nan, -0.0 and inf compare as themselves)."""
    if fields is None:
        return None
    return tuple((type(v).__name__, repr(v)) for v in fields)


def needs_twin(line: bytes, limit: int = parse.PARSE_LIMIT) -> bool:
    """Whether the compiled parser hands `line` to the twin: its decoded text holds a
    character that is alphanumeric or whitespace beyond ASCII, bar `µ`."""
    head = line[:limit]
    if b"\r" in head:
        head = head.rstrip(b"\r").rpartition(b"\r")[2]
    return any(
        ord(c) >= 0x80 and c != "µ" and (c.isalnum() or c.isspace())
        for c in head.decode("utf-8", "replace")
    )


def assert_same(native_parser, reference, line: bytes) -> None:
    expected = reference.parse(line)
    before = native_parser.fallbacks
    got = native_parser.parse(line)
    assert comparable(got) == comparable(expected), line
    assert native_parser.fallbacks - before == needs_twin(line, reference.parse_limit), line


def test_the_corpora_read_the_same_and_in_c(native):
    lines = corpus_lines() + bench_lines()
    compiled, reference = parsers(native), parsers(stepnumbers_ref)
    numbers = 0
    for line in lines:
        expected = reference.parse(line)
        assert comparable(compiled.parse(line)) == comparable(expected), line
        public = parse.parse_candidate(line)
        assert comparable(expected) == comparable(None if public is None else tuple(public)), line
        numbers += expected is not None
    assert numbers > 1000  # the corpora do state numbers
    assert compiled.fallbacks == sum(needs_twin(line) for line in lines)
    assert compiled.fallbacks < 0.01 * len(lines)  # tqdm's blocks, U+FFFD: read in C


def test_ascii_lines_never_reach_the_twin(native):
    compiled = parsers(native)
    lines = [line for line in corpus_lines() + bench_lines() if line.isascii()]
    lines += [b"loss=1.5 | " * 500, b"\r".join([b"x: 1 it/s loss=2"] * 300), b"", b"\r\r"]
    for line in lines:
        compiled.parse(line)
    assert compiled.fallbacks == 0
    # the characters tqdm draws with and U+FFFD from invalid UTF-8 are read in C too
    for line in (
        "█▏▎ 3/10 ━ loss=1 µs".encode(),
        b"loss=\xff\xfe1 \xc3 step=2",
        "━ 1/2 [".encode(),
    ):
        compiled.parse(line)
    assert compiled.fallbacks == 0
    compiled.parse("loss=١".encode())  # an Arabic-Indic digit: `\d` and float() read it
    assert compiled.fallbacks == 1


TRICKY = [
    b"loss=1e999 grad_norm=-1e999 lr=1e-999 loss_scale=+inf step=nan",
    b"loss: INFINITY | lr: Infinity | grad norm: NaN | loss scale: -INF | x: nAn",
    b"loss=infinitys time infs step=1.e5 iter .5e3 epoch 1.",
    b"loss=1.5.3 loss=2 lr=1e5x lr=3ms time 12.5ms",
    b"val loss: 2.3 loss: 1.1",
    b"eval_loss=1 loss=2",
    b"VALIDATION loss=1",
    b"xval loss=3 loss=4",
    b"val \nloss=5",
    b"validation\tloss=6 best loss 7",
    b"1234567val loss=8",
    b"'loss': '2.31', \"grad_norm\": [1.5], 'lr\": 3",
    b"loss     =1 loss    =2",
    b"loss=" + b" " * 17 + b"3 loss=" + b" " * 16 + b"4",
    b"a" * 70 + b"/loss=1 " + b"b" * 64 + b"=2 step=3",
    b"x/loss=1 .loss=2 -loss=3 _loss 4 /loss 5 loss\t6",
    b"iteration 12/ 100 | loss: 3 |",
    b"iteration" + b" " * 17 + b"1/2 | lm loss: 1 |",
    b" iteration      100/    5000 | consumed samples: 5 | lm loss: 2.3E+00 | loss scale: 1.0 |",
    b"[Rank 12345678] [Rank 3] step=10, skipped=3, lr=[0.0001]",
    b"epoch 001:  100 / 1000 loss=9.1, wps=1e3, ups=1",
    b"   epoch 001 | loss 9.1 | wps 1000 | num_updates 5",
    b"x | epoch 3 | loss 1 |",
    b"[1000] collection=train timing/steps_per_second=3.4, train/loss=2.3",
    b"x] [7] collection=" + b"c" * 65 + b" loss=1",
    b"[5] collection=xyz",
    b"Epoch 0: 40%|####| 40/1095 [00:03<01:37, 10.84it/s, v_num=10, train_loss=2.310]",
    b"loss=1 3.5 s/it 2 it/s",
    b"loss=1 1it/sx 2 it/s",
    b"100/1000 [==>...] - ETA: 1:23 - loss: 0.2345 - 12ms/step",
    b"loss: 1 - 1.5us/step 2s/step",
    b"time 12.3ms loss 4.2341",
    b"train_runtime=3 loss=1",
    b"{'loss': 1, 'epoch': inf, 'step': 1e300}",
    b"step=-0.0 loss=1 skipped=2.5 number of skipped iterations: 4",
    b"loss=1\rloss=2\r\r",
    b"loss=1 " * 700,
    b"\x1c loss 1 \x1f| \x0b lm loss: 2 \x0c| lr 3",
    "loss=1 µs step=2µs time 3µs x: 4 1µs/step".encode(),
    "loss=1.5 ━ 3/10 ━ 4/9 [x".encode(),
    "lossé=1 loss=2 \u00a0step=3".encode(),
    "\u212a loss=1 \u017ftep=2 \u0130ter 3 \u212aval loss=4".encode(),
    "loss=\u0663\u0664 step=١٢".encode(),
    b"loss=\xe2\x94 step=\xc3(3) \xff",
    "loss=1 █".encode() * 1500 + b" step=2",  # past 4096 characters beyond ASCII
    "a\rloss=1 █ \r".encode(),
]


@pytest.mark.parametrize("line", TRICKY, ids=range(len(TRICKY)))
def test_tricky_lines_read_the_same(native, line):
    for limit in (parse.PARSE_LIMIT, 3 * parse.PARSE_LIMIT, SHORT_LIMIT, 9, 0):
        assert_same(parsers(native, limit), parsers(stepnumbers_ref, limit), line)


KEYS = sorted(
    {
        *TABLES[0], *TABLES[1], *TABLES[2], *TABLES[3], *TABLES[4], *TABLES[5], *TABLES[6],
        *TABLES[8], "epoch", "time", "skipped", "number of skipped iterations", "iter", "Loss",
        "LOSS", "Iter", "Step", "Epoch", "LR", "Time", "eval_loss", "v_num", "mom",
        "elapsed time per iteration (ms)", "throughput per GPU (TFLOP/s/GPU)",
    }
)  # fmt: skip
key = st.one_of(
    st.sampled_from(KEYS),
    st.sampled_from(KEYS).map(str.upper),
    st.sampled_from(KEYS).map(lambda k: k.replace(" ", "  ")),
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_/.\-]{0,70}", fullmatch=True),
).map(str.encode)
digits = st.integers(0, 24).flatmap(lambda n: st.text("0123456789", min_size=n, max_size=n))
mantissa = st.tuples(digits, st.sampled_from(["", "."]), digits).map("".join)
signs = st.sampled_from(["", "+", "-"])
exponent = st.one_of(st.just(""), st.tuples(st.sampled_from("eE"), signs, digits).map("".join))
words = st.sampled_from(
    ["nan", "NaN", "NAN", "inf", "Inf", "INF", "infinity", "Infinity", "INFINITY", "nAn", "infs"]
)
number = st.tuples(
    st.sampled_from(["", "", "-", "+"]),
    st.one_of(st.tuples(mantissa, exponent).map("".join), words),
    st.sampled_from(["", "", "", "ms", "us", "µs", "s", "m", "sx", ".", "x", "/step", "s/step"]),
).map(lambda parts: "".join(parts).encode())
small = st.integers(0, 10**13).map(lambda n: str(n).encode())
PIECES = [
    b"=", b":", b": ", b" = ", b"\t:", b"     =", b" ", b"  ", b"\t", b"'", b'"', b"[", b"]",
    b"{'", b'{"', b"}", b"|", b" | ", b",", b", ", b"/", b".", b"-", b"_", b"(", b")",
    b"it/s", b"s/it", b" it/s", b"/step", b"ms/step", b" - loss: ", b"v_num=", b"SamplesPerSec=",
    b"skipped=", b"step=", b"iteration ", b"iteration      ", b" / ", b"epoch ", b"| epoch ",
    b"] [", b" collection=train", b"val ", b"eval ", b"VALIDATION ", b"best\t", b"test ",
    b"dev ", b"xval ", b"\n", b"\r", b"\r\r", b"[Rank ", b"lm loss: ", b"loss scale: ",
    b"number of skipped iterations: ", b"elapsed time per iteration (ms): ",
    "━".encode(), "█▏▎".encode(), "\ufffd".encode(), "µ".encode(), "١".encode(),
    "é".encode(), "\u212a".encode(), "ſ".encode(), "İ".encode(), "\xa0".encode(),
    "\u2003".encode(), "\x85".encode(), b"\x1c", b"\x0b", b"\x00", b"\xff", b"\xc3",
    b"\xe2\x94", b"x" * 40, b" " * 30,
]  # fmt: skip
piece = st.one_of(st.sampled_from(PIECES), key, number, small)
TEMPLATES = [
    b"[2023-08-02 00:41:17,526] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=3,"
    b" lr=[0.0001], mom=[(0.9, 0.999)]",
    b" iteration      100/    5000 | consumed samples:        51200 | elapsed time per "
    b"iteration (ms): 1234.5 | learning rate: 1.000000E-04 | lm loss: 2.345678E+00 |",
    b"{'loss': '2.31', 'grad_norm': '1.234', 'learning_rate': '4.9e-05', 'epoch': '0.01'}",
    "Epoch 0:  40%|████▏ | 40/1095 [00:03<01:37, 10.84it/s, v_num=10, train_loss=2.310]".encode(),
    b"epoch 001:  100 / 1000 loss=9.1, nll_loss=2.3, ppl=5, wps=12345, ups=1.2, wpb=4096",
    b"[1000] timing/steps_per_second=3.4, train/loss=2.3",
    b"100/1000 [==>...] - ETA: 1:23 - loss: 0.2345 - 12ms/step",
    b"iter 100: loss 4.2341, time 12.3ms, mfu 38.1%",
]  # fmt: skip


@st.composite
def spliced(draw) -> bytes:
    """A framework's line with grammar pieces put in and parts cut out."""
    line = draw(st.sampled_from(TEMPLATES))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(line)))
        if draw(st.booleans()):
            line = line[:at] + draw(piece) + line[at:]
        else:
            line = line[:at] + line[at + draw(st.integers(0, 12)) :]
    return line


grammar_lines = st.lists(piece, max_size=30).map(b"".join)
long_lines = st.tuples(st.integers(3980, 4100), grammar_lines).map(
    lambda t: (b"loss=1 " * 600)[: t[0]] + t[1]
)
unicode_lines = st.text(st.characters(blacklist_categories=("Cs",)), max_size=120).map(
    lambda text: ("loss=1 " + text).encode("utf-8", "replace")
)


REFERENCE_PARSERS = (parsers(stepnumbers_ref), parsers(stepnumbers_ref, SHORT_LIMIT))


@pytest.fixture(scope="module")
def native_parsers(native):
    return parsers(native), parsers(native, SHORT_LIMIT)


@hypothesis_seed(HYPOTHESIS_SEED)
@settings(max_examples=3500, deadline=None)
@given(
    line=st.one_of(
        grammar_lines, grammar_lines, spliced(), spliced(), long_lines, unicode_lines,
        st.binary(max_size=300),
    )
)  # fmt: skip
@example(line=b"loss=" + b"9" * 400)
@example(line=b"loss=1" + b"\xe2\x94\x81" * 1400)  # the limit cuts a character
def test_native_equals_reference_on_hypothesis_lines(native_parsers, line):
    print("hypothesis seed", HYPOTHESIS_SEED)
    for compiled, reference in zip(native_parsers, REFERENCE_PARSERS, strict=True):
        assert_same(compiled, reference, line)


@hypothesis_seed(HYPOTHESIS_SEED)
@settings(max_examples=1500, deadline=None)
@given(
    value=st.one_of(
        st.floats(allow_nan=False).map(repr),
        st.floats(width=32).map(lambda v: f"{v:.9g}"),
        st.tuples(signs, digits, st.sampled_from([".", ""]), digits, exponent).map("".join),
    )
)
@example(value="9007199254740993")  # 2^53 + 1: past the exact fast path
@example(value="0.1e-22")
@example(value="-0")
def test_numbers_are_what_float_reads(native_parsers, value):
    print("hypothesis seed", HYPOTHESIS_SEED)
    line = f"loss={value} | lm loss: {value} | x".encode()
    assert_same(native_parsers[0], REFERENCE_PARSERS[0], line)


def test_characters_the_c_scan_reads_are_punctuation_to_the_regexes():
    """What the C scan relies on: a character beyond ASCII that is neither alphanumeric nor
    whitespace is not `\\w` or `\\d` to `re`, and lowers to no ASCII letter that `val`, `test`,
    `best` or `dev` could match (with re.I neither); alphanumeric is exactly `\\w`."""
    word, letters = re.compile(r"\w"), re.compile("[valeidtsbno]", re.I)
    for cp in range(0x80, 0x110000):
        c = chr(cp)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        assert bool(word.match(c)) == c.isalnum(), hex(cp)
        if c.isalnum() or c.isspace():
            continue
        assert not letters.match(c) and all(ord(x) >= 0x80 for x in c.lower()), hex(cp)


def test_every_unicode_category_reads_the_same(native):
    compiled, reference = parsers(native), parsers(stepnumbers_ref)
    by_category: dict[str, list[str]] = {}
    for cp in range(0x80, 0x110000, 3):
        by_category.setdefault(unicodedata.category(chr(cp)), []).append(chr(cp))
    for category, chars in by_category.items():
        if category == "Cs":
            continue
        for c in chars[:: max(1, len(chars) // 12)]:
            for line in (f"val{c} loss=1 {c}step=2", f"loss{c}: 3{c} it/s", f"{c}lr 4ms/step"):
                assert_same(compiled, reference, line.encode())


def test_both_twins_check_their_tables(native):
    for module in (native, stepnumbers_ref):
        with pytest.raises(ValueError, match="µs"):
            module.StepParser(*TABLES[:7], {"ms": 1e-3, "us": 1e-6, "s": 1.0}, (), 10)
        with pytest.raises(ValueError):
            module.StepParser(*TABLES, -1)
        assert module.StepParser(*TABLES, 10).parse_limit == 10


def test_bytes_like_lines_are_read_by_the_twin(native):
    compiled, reference = parsers(native), parsers(stepnumbers_ref)
    for line in (bytearray(b"loss=1 step=2"), bytearray(b"x\rloss=3 it/s\r")):
        assert comparable(compiled.parse(line)) == comparable(reference.parse(line))
    assert compiled.fallbacks == 2


def test_tables_are_data(native):
    """Other tables give other results, the same in both (no key is built into the C)."""
    tables = (("cost",), ("g",), (), ("eta",), ("k",), {"dt": 2.0}, {"tput": "x/s"},
              parse._UNIT_SECONDS, ("done",))  # fmt: skip
    compiled, reference = native.StepParser(*tables, 100), stepnumbers_ref.StepParser(*tables, 100)
    for line in (b"cost=1 g=2 eta=3 k=4 dt=5 tput=6", b"cost=1 dt=5ms", b"done=1 cost=2"):
        assert comparable(compiled.parse(line)) == comparable(reference.parse(line))
    assert compiled.parse(b"cost=1 dt=5ms")[4:9] == (1.0, None, None, None, 5 * 1e-3)
    assert math.isnan(compiled.parse(b"cost=nan")[4])
