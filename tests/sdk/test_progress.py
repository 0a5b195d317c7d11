"""Progress, hang and straggler detection: the pure rules, a single process that stalls, and
real gloo jobs (spawned ranks) where one rank sleeps, stops (SIGSTOP) or blocks forever."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson

from denpex.core.events import Event, Evidence
from denpex.sdk.progress import ProgressMonitor
from denpex.series.progress import PeerView, deadline_of, find_stragglers, judge_hang
from denpex.series.thresholds import ProgressRules, with_options


def Thresholds(**overrides: float) -> ProgressRules:
    """The shipped progress thresholds with `overrides`."""
    return with_options(ProgressRules, overrides)


CHILD = Path(__file__).parent / "children" / "progress_job.py"
FLOOR_S = 3.0
PG_TIMEOUT_S = 60.0  # what the child job gives its process group


def view(
    rank: int,
    step: int = 10,
    *,
    step_age: float = 0.0,
    beat_age: float = 0.0,
    interval: float | None = 0.1,
    busy: float | None = 0.1,
    where: str = "compute",
    seen: bool = True,
    now: float = 100.0,
) -> PeerView:
    return PeerView(
        rank,
        step,
        1,
        interval,
        busy,
        where,
        "",
        "h",
        False,
        now - step_age,
        now - beat_age,
        seen=seen,
    )


# --- pure rules ---------------------------------------------------------------------------


def test_deadline_is_the_larger_of_twice_the_median_and_the_floor() -> None:
    th = Thresholds(hang_floor_s=5.0, hang_startup_s=50.0)
    views = [view(0, interval=1.0), view(1, interval=4.0), view(2, interval=4.0)]
    assert deadline_of(views, th) == 8.0
    assert deadline_of([view(0, interval=0.1)], th) == 5.0
    assert deadline_of([view(0, interval=None)], th) == 50.0  # no step time yet: start-up


def test_options_keep_only_known_thresholds() -> None:
    th = ProgressRules.from_options({"hang_floor_s": "7", "straggler_window": 5.0, "every": 50})
    assert th.hang_floor_s == 7.0 and th.straggler_window == 5 and th.straggler_ratio == 1.10


def test_no_hang_while_steps_are_fresh() -> None:
    th = Thresholds(hang_floor_s=5.0)
    assert judge_hang([view(0, step_age=4.0), view(1, step_age=1.0)], 100.0, th) is None


def test_hang_names_the_unresponsive_rank_and_a_live_reporter() -> None:
    th = Thresholds(hang_floor_s=5.0, unresponsive_s=2.0)
    views = [
        view(0, step_age=6, where="collective"),
        view(1, step_age=6, beat_age=6),
        view(2, step_age=6, where="collective"),
    ]
    hang = judge_hang(views, 100.0, th)
    assert hang is not None and [v.rank for v in hang.culprits] == [1]
    assert hang.reason == "unresponsive" and hang.reporter == 0
    assert hang.signature == "train.hang.rank_unresponsive"


def test_hang_names_the_rank_behind_then_the_one_outside_collectives() -> None:
    th = Thresholds(hang_floor_s=5.0)
    behind = judge_hang([view(0, 11, step_age=6), view(1, 10, step_age=7)], 100.0, th)
    assert behind is not None and [v.rank for v in behind.culprits] == [1]
    assert behind.reason == "behind"
    views = [view(0, step_age=6, where="backward"), view(1, step_age=6, where="compute")]
    outside = judge_hang(views, 100.0, th)
    assert outside is not None and [v.rank for v in outside.culprits] == [1]
    assert outside.reason == "outside_collective"
    stuck = judge_hang([view(0, step_age=6), view(1, step_age=6)], 100.0, th)
    assert stuck is not None and stuck.reason == "all_stalled" and len(stuck.culprits) == 2


def test_a_rank_never_heard_from_is_named_but_never_triggers() -> None:
    th = Thresholds(hang_floor_s=5.0)
    quiet = [view(0, step_age=1), view(1, seen=False, step_age=60)]
    assert judge_hang(quiet, 100.0, th) is None
    hang = judge_hang([view(0, step_age=6, where="collective"), view(1, seen=False)], 100.0, th)
    assert hang is not None and [v.rank for v in hang.culprits] == [1] and hang.reason == "silent"


def test_straggler_needs_ten_percent_over_its_peers_median() -> None:
    th = Thresholds(straggler_min_s=0.001)
    views = [view(0, busy=0.100), view(1, busy=0.109), view(2, busy=0.100), view(3, busy=0.125)]
    assert [s.rank for s in find_stragglers(views, th)] == [3]
    assert find_stragglers([view(0, busy=0.1), view(1, busy=None)], th) == []
    tiny = [view(0, busy=0.0010), view(1, busy=0.0015)]
    assert find_stragglers(tiny, th) == []  # below the noise floor


# --- one process ----------------------------------------------------------------------------


def test_single_process_stall_is_reported_and_close_stops_the_watchdog() -> None:
    got: list[Evidence | Event] = []
    monitor = ProgressMonitor(
        rank=0,
        world_size=1,
        emit=got.append,
        host="h",
        options={"hang_floor_s": 1.0, "watchdog_interval_s": 0.1, "metric_every_s": 0.2},
    )
    for step in range(1, 6):
        time.sleep(0.01)
        monitor.on_step(step, 1.0, None)
    stalled_at = time.monotonic()
    while time.monotonic() - stalled_at < 5:
        if any(isinstance(e, Evidence) for e in got):
            break
        time.sleep(0.05)
    waited = time.monotonic() - stalled_at
    monitor.close()
    hangs = [e for e in got if isinstance(e, Evidence)]
    assert len(hangs) == 1, got
    hang = hangs[0]
    assert hang.category == "train.hang" and hang.signature == "train.hang.heartbeat_stale"
    assert hang.captures["rank"] == "0" and hang.captures["step"] == "5"
    assert hang.event.source == "sdk" and hang.event.kind == "state" and hang.event.rank == 0
    assert "test_progress.py" in hang.captures["where"]  # the training thread's own frame
    assert 1.0 <= waited < 2.0
    assert any(isinstance(e, Event) and e.body == "sdk_step_seconds" for e in got)
    assert not any(t.name == "denpex-progress-watchdog" for t in threading.enumerate())


def test_emit_failures_never_reach_training() -> None:
    attempts: list[object] = []

    def broken(item: object) -> None:
        attempts.append(item)
        raise RuntimeError("transport down")

    monitor = ProgressMonitor(
        emit=broken, options={"hang_floor_s": 0.2, "watchdog_interval_s": 0.05}
    )
    monitor.on_step(1, None, None)  # then the training thread stalls: a hang to report
    deadline = time.monotonic() + 5
    while not attempts and time.monotonic() < deadline:
        time.sleep(0.02)
    beats_at_failure = monitor._beat
    time.sleep(0.3)
    monitor.on_step(2, None, None)  # the training thread still works after the failure
    monitor.close()
    monitor.close()  # twice is fine
    assert attempts and isinstance(attempts[0], Evidence)
    assert attempts[0].category == "train.hang"  # the report was tried and failed ...
    assert monitor._beat > beats_at_failure  # ... and the watchdog went on beating
    assert not monitor._thread.is_alive()


def test_frames_of_user_code_in_a_folder_named_denpex_are_named(tmp_path: Path) -> None:
    # a clone of the repository keeps its code under `denpex/` (the default of git clone);
    # only the installed package's own frames are skipped, not every path holding `denpex/`
    from denpex.sdk.progress import _main_thread_place

    script = tmp_path / "denpex" / "examples" / "train_loop.py"
    script.parent.mkdir(parents=True)
    script.write_text("def train_step(ready, release):\n    ready.set()\n    release.wait(10)\n")
    namespace: dict = {}
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    ready, release = threading.Event(), threading.Event()
    worker = threading.Thread(target=namespace["train_step"], args=(ready, release))
    worker.start()
    try:
        assert ready.wait(10)
        where, place = _main_thread_place(worker.ident or 0)
    finally:
        release.set()
        worker.join()
    assert where == "compute"
    assert place == "train_loop.py:3 train_step"


def test_a_world_without_a_store_says_hangs_of_other_ranks_are_not_watched() -> None:
    got: list = []
    monitor = ProgressMonitor(
        rank=1, world_size=4, emit=got.append, options={"watchdog_interval_s": 0.05}
    )
    time.sleep(0.2)
    monitor.close()
    (lost,) = [e for e in got if isinstance(e, Event) and e.body == "sdk_coverage_lost"]
    assert lost.attrs["check"] == "progress" and lost.rank == 1
    assert "not initialized" in lost.attrs["reason"]


class StoppedStore:
    """A Store whose server went away: every call fails as TCPStore's client does."""

    def set(self, key: str, value: bytes) -> None:
        raise RuntimeError("Connection reset by peer")

    def check(self, keys: list[str]) -> bool:
        raise RuntimeError("Connection reset by peer")

    def multi_get(self, keys: list[str]) -> list[bytes]:
        raise RuntimeError("Connection reset by peer")


def test_a_store_that_stops_answering_is_reported_as_lost_coverage_once() -> None:
    got: list = []
    monitor = ProgressMonitor(
        rank=0,
        world_size=2,
        emit=got.append,
        options={"store": StoppedStore(), "watchdog_interval_s": 0.1, "store_failures_lost": 3},
    )
    for step in range(1, 4):  # before the first tick, 0.1 s away
        monitor.on_step(step, None, None)
    time.sleep(0.8)
    monitor.close()
    lost = [e for e in got if isinstance(e, Event) and e.body == "sdk_coverage_lost"]
    assert len(lost) == 1 and lost[0].attrs["check"] == "progress"
    assert lost[0].attrs["since_step"] == 3 and "Connection reset" in lost[0].attrs["reason"]


# --- real distributed jobs ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_jsonl(folder: Path, pattern: str) -> list[dict]:
    records = []
    for path in sorted(folder.glob(pattern)):
        records.extend(orjson.loads(line) for line in path.read_bytes().splitlines() if line)
    return records


def run_job(
    tmp_path: Path, scenario: str, until_signature: str | None, *extra: str, limit_s: float = 90.0
) -> tuple[list[dict], list[dict]]:
    """Run the child job; stop it once `until_signature` evidence arrives (or it exits)."""
    cmd = [
        sys.executable,
        str(CHILD),
        scenario,
        str(tmp_path),
        "--port",
        str(free_port()),
        "--floor",
        str(FLOOR_S),
        *extra,
    ]
    proc = subprocess.Popen(cmd, start_new_session=True, stderr=subprocess.PIPE)
    try:
        started = time.monotonic()
        while time.monotonic() - started < limit_s and proc.poll() is None:
            found = read_jsonl(tmp_path, "evidence-*.jsonl")
            if until_signature and any(e.get("signature") == until_signature for e in found):
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=30)
    if until_signature is None:
        assert proc.returncode == 0, stderr.decode(errors="replace")[-3000:]
    return read_jsonl(tmp_path, "evidence-*.jsonl"), read_jsonl(tmp_path, "marks-*.jsonl")


def evidence_of(records: list[dict], category: str) -> list[dict]:
    return [r for r in records if r.get("category") == category]


def test_sleeping_rank_is_a_straggler_and_a_stopped_rank_a_hang(tmp_path: Path) -> None:
    records, marks = run_job(
        tmp_path,
        "stop",
        "train.hang.rank_unresponsive",
        "--world",
        "4",
        "--readers",
        "2",
        "--straggler",
        "3",
        "--culprit",
        "1",
    )  # rank 3 only writes heartbeats; ranks 0 and 1 read them, rank 0 reports
    stragglers = evidence_of(records, "train.straggler")
    assert stragglers, records
    assert {s["captures"]["rank"] for s in stragglers} == {"3"}
    assert {s["captures"]["reporter_rank"] for s in stragglers} == {"0"}
    assert float(stragglers[0]["captures"]["ratio"]) >= 1.10
    hangs = evidence_of(records, "train.hang")
    assert len(hangs) == 1, hangs
    hang = hangs[0]
    assert hang["rank"] == 1 and hang["captures"]["rank"] == "1"
    assert hang["captures"]["reason"] == "unresponsive"
    assert hang["captures"]["reporter_rank"] == "0"
    stopped_at = next(m["hung_at"] for m in marks if "hung_at" in m)
    delay = hang["received_wall"] - stopped_at
    # named about the floor after the last step (one step + one tick of slack), long before
    # the collective timeout
    assert FLOOR_S - 1.0 <= delay < FLOOR_S + 4.0 < PG_TIMEOUT_S, delay


def test_rank_blocked_outside_collectives_is_named(tmp_path: Path) -> None:
    records, marks = run_job(tmp_path, "block", "train.hang.heartbeat_stale", "--culprit", "2")
    hangs = evidence_of(records, "train.hang")
    assert len(hangs) == 1, hangs
    assert hangs[0]["captures"]["rank"] == "2", hangs
    assert hangs[0]["captures"]["reason"] == "outside_collective"
    assert "progress_job.py" in hangs[0]["captures"]["where"]
    blocked_at = next(m["hung_at"] for m in marks if "hung_at" in m)
    assert FLOOR_S - 1.0 <= hangs[0]["received_wall"] - blocked_at < FLOOR_S + 4.0
    assert not evidence_of(records, "train.straggler")


def test_healthy_job_reports_nothing_and_finishes(tmp_path: Path) -> None:
    records, marks = run_job(tmp_path, "healthy", None, "--steps", "40", "--world", "2")
    assert [r for r in records if "category" in r] == []
    assert sum(1 for m in marks if "done" in m) == 2


def test_reporter_is_the_lowest_live_reader() -> None:
    th = Thresholds(hang_floor_s=5.0, unresponsive_s=2.0)
    views = [
        view(0, step_age=6, beat_age=6),
        view(1, step_age=6, where="collective"),
        view(2, step_age=6, where="collective"),
        view(5, step_age=6, where="collective"),
    ]
    hang = judge_hang(views, 100.0, th, reporters={0, 1, 2})
    assert hang is not None and hang.reporter == 1 and [v.rank for v in hang.culprits] == [0]
    assert judge_hang(views, 100.0, th, reporters={0}).reporter is None  # type: ignore[union-attr]


def test_guard_drives_the_monitor_and_a_stall_is_a_hang() -> None:
    import torch

    from denpex.sdk.watch import watch

    got: list = []
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = watch(model, optimizer, emit=got.append, hang_floor_s=1.0, watchdog_interval_s=0.1)
    assert isinstance(guard.monitor, ProgressMonitor)
    for _ in range(5):
        loss = model(torch.randn(8, 4)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        guard.step(loss=loss)
    started = time.monotonic()
    while time.monotonic() - started < 5 and not any(
        isinstance(e, Evidence) and e.category == "train.hang" for e in got
    ):
        time.sleep(0.05)
    guard.close()
    hangs = [e for e in got if isinstance(e, Evidence) and e.category == "train.hang"]
    assert len(hangs) == 1 and hangs[0].captures["step"] == "5", got
    assert guard.monitor._closed


def test_store_host_stopped_is_named_from_a_rank_that_cannot_reach_it() -> None:
    import datetime

    from torch.distributed import TCPStore

    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time, datetime; from torch.distributed import TCPStore; "
            f"s = TCPStore('127.0.0.1', {port}, 2, True, datetime.timedelta(seconds=30), "
            "wait_for_workers=False); print('up', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        store = TCPStore("127.0.0.1", port, 2, False, datetime.timedelta(seconds=10))
        got: list = []
        monitor = ProgressMonitor(
            rank=1,
            world_size=2,
            emit=got.append,
            host="h",
            options={
                "store": store,
                "hang_floor_s": 1.5,
                "watchdog_interval_s": 0.1,
                "store_timeout_s": 0.3,
            },
        )
        for step in range(1, 4):
            monitor.on_step(step, None, None)
        time.sleep(0.3)
        os.kill(server.pid, signal.SIGSTOP)  # the store's host freezes, as a stopped rank 0
        started = time.monotonic()
        while not got and time.monotonic() - started < 8:
            time.sleep(0.05)
        monitor.close()
    finally:
        server.kill()
        server.wait()
    found = [e for e in got if isinstance(e, Evidence)]
    assert found and found[0].signature == "train.hang.store_unreachable", got
    assert found[0].event.rank == 0 and found[0].captures["reporter_rank"] == "1"


def test_the_lowest_rank_reports_a_job_that_slows_down_against_its_own_pace() -> None:
    got: list = []
    monitor = ProgressMonitor(
        rank=0,
        world_size=1,
        emit=got.append,
        options={
            "watchdog_interval_s": 0.02,
            "straggler_window": 4,  # the step time is the median of the last 4 steps
            "throughput_warmup": 1,
            "throughput_baseline": 4,
            "throughput_recent": 3,
            "hang_floor_s": 60,
        },
    )
    for step in range(1, 121):
        time.sleep(0.005 if step <= 60 else 0.03)  # steps become 6 times slower
        monitor.on_step(step, None, None)
    monitor.close()
    drops = [e for e in got if isinstance(e, Evidence) and e.category == "train.straggler"]
    assert len(drops) == 1, got
    assert drops[0].signature == "train.straggler.throughput_drop"
    assert drops[0].summary.startswith("the job slowed down") and drops[0].event.rank == 0
    assert int(drops[0].captures["step"]) > 60
