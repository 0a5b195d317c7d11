"""The node agent as users run it: `denpex agent` started for real, the kernel log written
for real, a process OOM-killed for real, and `denpex run` registering with it."""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from denpex.core import jsonio
from denpex.core.wire import Registration
from denpex.lite.agent_link import AgentLink
from tests import memcg
from tests.agent.otlp_receiver import OtlpReceiver
from tests.kernel_log import inject, needs_kernel_log

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starts the agent as root")


class RunningAgent:
    def __init__(self, tmp_path: Path, extra_config: str = "") -> None:
        config = tmp_path / "agent.yaml"
        config.write_text(
            # eBPF keeps its 15 s default: its OOM victims must wake a poll themselves
            "collectors:\n  cgroup: {interval_s: 0.5}\n  proc: {interval_s: 1}\n" + extra_config
        )
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "denpex", "agent", "--listen", "127.0.0.1:0"),
                *("--state-dir", str(tmp_path / "state"), "--config", str(config)),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log: list[str] = []
        first = self.proc.stderr.readline()
        self.log.append(first)
        found = re.search(r"listening on (http://\S+)", first)
        assert found, f"the agent did not start: {first!r}"
        self.url = found.group(1)
        self.socket = str(tmp_path / "state" / "agent.sock")  # registration (denpex run)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)

    def get(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            body = response.read()
        return jsonio.loads(body) if path.startswith("/v1") else body.decode()

    def register(self, registration: Registration) -> None:
        link = AgentLink(self.socket, timeout_s=5)
        assert link.register(registration), link.reason

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def agent(tmp_path):
    running = RunningAgent(tmp_path)
    yield running
    running.stop()
    assert running.proc.returncode == 0, "".join(running.log)


def wait_for(fetch, predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if predicate(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


@needs_kernel_log
def test_a_kernel_xid_reaches_the_api_within_a_second_and_shows_in_metrics(agent):
    latencies = []
    for _ in range(3):  # best of three: a shared CI machine may stall one attempt
        marker = random.randrange(10**8, 10**9)
        line = f"<4>NVRM: Xid (PCI:0000:3b:00): 79, pid={marker}, GPU has fallen off the bus.\n"
        since = time.time_ns()
        inject(line.encode())
        found = wait_for(
            lambda s=since: agent.get(f"/v1/evidence?since={s}")["evidence"],
            lambda items, m=marker: any(str(m) in e["body"] for e in items),
            timeout=5,
        )
        latencies.append((time.time_ns() - since) / 1e9)
        hits = [e for e in found if str(marker) in e["body"]]
        assert hits, f"the Xid never arrived; agent log: {agent.log}"
        assert hits[0]["category"] == "gpu.fallen_off_bus" and hits[0]["source"] == "kmsg"
        if latencies[-1] < 1.0:
            break
    assert min(latencies) < 1.0, f"evidence latencies {latencies}"

    families = {f.name: f for f in text_string_to_metric_families(agent.get("/metrics"))}
    xid = [
        s
        for s in families["denpex_evidence"].samples
        if s.labels == {"category": "gpu.fallen_off_bus", "severity": "critical"}
    ]
    assert xid and xid[0].value >= 1
    assert agent.get("/healthz")  # 200 (urlopen raises on 503)


@pytest.mark.skipif(memcg.unavailable_reason() is not None, reason=str(memcg.unavailable_reason()))
def test_a_real_oom_kill_is_attributed_to_the_registered_job(agent):
    since = time.time_ns()
    with memcg.memory_cgroup() as (folder, cgroup):
        hog = subprocess.Popen(
            [sys.executable, "-c", memcg.HOG], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        memcg.enter(folder, hog.pid)
        agent.register(Registration(pid=hog.pid, job="oom-e2e", rank=3, cgroup=cgroup))
        time.sleep(1.2)  # one cgroup poll records the baseline before the kill
        hog.communicate(b"go\n", timeout=30)
        assert hog.returncode == -9, "the hog was not OOM-killed"
        unavailable = jsonio.loads(urllib.request.urlopen(agent.url + "/healthz").read())[
            "unavailable"
        ]
        wanted = {"kmsg", "cgroup"} | ({"ebpf.oom"} if "ebpf" not in unavailable else set())
        items = wait_for(
            lambda: agent.get(f"/v1/evidence?since={since}&job=oom-e2e")["evidence"],
            lambda found: wanted <= {e["source"] for e in found},
            timeout=8,
        )
    by_source = {e["source"]: e for e in items if e["category"] == "host.oom_killed"}
    assert wanted <= set(by_source), f"got {sorted(by_source)}; agent log: {agent.log}"
    for item in by_source.values():
        assert (item["job"], item["rank"]) == ("oom-e2e", 3)
    assert by_source["kmsg"]["captures"]["pid"] == str(hog.pid)


CHILD_CHECKS_REGISTRATION = """
import json, os, sys, time, urllib.request
url = sys.argv[1]
for _ in range(600):  # denpex registers the job once its analyzer has loaded the catalog
    jobs = json.load(urllib.request.urlopen(url + "/v1/jobs"))["jobs"]
    if any(job["pid"] == os.getpid() for job in jobs):
        print("registered as", [j["job"] for j in jobs if j["pid"] == os.getpid()][0])
        break
    time.sleep(0.05)
else:
    print("never registered")
"""


def test_denpex_run_registers_its_job_and_unregisters_at_the_end(agent, tmp_path):
    env = {**os.environ, "DENPEX_AGENT_SOCKET": agent.socket, "SLURM_JOB_ID": "4711"}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "denpex", "run", "--quiet", "--no-pty", "--"),
            *(sys.executable, "-c", CHILD_CHECKS_REGISTRATION, agent.url),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "registered as 4711", done.stdout + done.stderr
    assert agent.get("/v1/jobs")["jobs"] == []


@needs_kernel_log
def test_evidence_and_metrics_reach_an_otlp_endpoint_through_the_spool(tmp_path):
    receiver = OtlpReceiver().start()
    receiver.status = 503  # down when the evidence happens: it must wait in the spool
    running = RunningAgent(
        tmp_path,
        f"otlp: {{endpoint: '{receiver.url}', metrics_interval_s: 0.5}}\n"
        "spool: {fsync: always}\n",
    )
    try:
        marker = random.randrange(10**8, 10**9)
        inject(f"<4>NVRM: Xid (PCI:0000:3b:00): 79, pid={marker}, GPU has fallen off.\n".encode())
        time.sleep(1.5)
        assert not [r for r in receiver.log_records() if str(marker) in r["body"]]
        receiver.status = 200
        records = wait_for(
            lambda: [r for r in receiver.log_records() if str(marker) in r["body"]],
            bool,
            timeout=30,
        )
        assert records, f"nothing delivered; agent log: {running.log}"
        (record,) = records
        assert record["attrs"]["denpex.category"] == "gpu.fallen_off_bus"
        assert record["resource"]["host.name"] and record["attrs"]["denpex.event_id"]
        names = wait_for(
            lambda: {
                m.name
                for r in receiver.metric_requests
                for rm in r.resource_metrics
                for sm in rm.scope_metrics
                for m in sm.metrics
            },
            lambda found: "denpex_psi_some_avg10_ratio" in found,
            timeout=10,
        )
        assert "denpex_psi_some_avg10_ratio" in names
    finally:
        running.stop()
        receiver.stop()


def test_sighup_reloads_the_configuration_file(tmp_path):
    running = RunningAgent(tmp_path)
    try:
        assert (
            "numa"
            not in jsonio.loads(urllib.request.urlopen(running.url + "/healthz").read())[
                "unavailable"
            ]
        )
        config = tmp_path / "agent.yaml"
        config.write_text(config.read_text() + "  numa: {enabled: false}\n")
        running.proc.send_signal(signal.SIGHUP)
        health = wait_for(
            lambda: jsonio.loads(urllib.request.urlopen(running.url + "/healthz").read()),
            lambda report: "numa" in report["unavailable"],
            timeout=30,  # a bound, not a wait: a loaded 2-core machine took over 10 s once
        )
        assert health["unavailable"]["numa"] == "disabled in the configuration"
        assert "numa" not in health["collectors"]
        config.write_text("collectors: {nosuch: {}}\n")  # a broken file keeps the old settings
        running.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "".join(running.log), lambda log: "reload refused" in log, timeout=30)
        assert "reload refused" in "".join(running.log) and running.proc.poll() is None
    finally:
        running.stop()


def ebpf_oom_unavailable(agent: RunningAgent) -> str | None:
    """Why this agent cannot see OOM victims through eBPF (the collector's own reason), or
    None when its oom program is attached."""
    health = jsonio.loads(urllib.request.urlopen(agent.url + "/healthz").read())
    if "ebpf" in health["unavailable"]:
        return f"the agent runs without eBPF here: {health['unavailable']['ebpf']}"

    def attached() -> float | None:
        families = {f.name: f for f in text_string_to_metric_families(agent.get("/metrics"))}
        family = families.get("denpex_ebpf_program_attached")
        values = [s.value for s in family.samples if s.labels["program"] == "oom"] if family else []
        return values[0] if values else None

    if wait_for(attached, lambda value: value is not None, timeout=30) == 1:
        return None
    said = [line for line in agent.log if "eBPF program oom" in line] or ["(no reason logged)"]
    return f"the eBPF oom program is not attached here: {said[-1].strip()}"


def _job_once_running(root: int, command: str, timeout_s: float) -> int:
    """The descendant of root that runs `python -c command`, as soon as it does."""
    want = [b"-c", command.encode()]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids, todo = [], [root]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            with contextlib.suppress(OSError):
                todo += map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
        for pid in pids:
            with contextlib.suppress(OSError):
                # denpex's own command line holds the job's: match argv[1:] exactly
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:3] == want:
                    return pid
        time.sleep(0.05)
    raise AssertionError(f"the job did not start within {timeout_s} s")


@pytest.mark.skipif(memcg.unavailable_reason() is not None, reason=str(memcg.unavailable_reason()))
def test_denpex_run_adds_the_agents_evidence_to_its_diagnosis(agent, tmp_path):
    """The run's own kernel-log and cgroup watches see the kill; the agent's eBPF OOM victim
    must reach the diagnosis too, although the analyzer registers the job only after loading
    the catalog (often after a short job died): the agent's evidence counts from the job's
    start."""
    why_not = ebpf_oom_unavailable(agent)
    if why_not:
        pytest.skip(why_not)
    report = tmp_path / "report.json"
    env = {**os.environ, "DENPEX_AGENT_SOCKET": agent.socket}
    with memcg.memory_cgroup() as (folder, _cgroup):
        run = subprocess.Popen(
            [
                *(sys.executable, "-m", "denpex", "run", "--quiet", "--no-pty"),
                *("--report", str(report), "--", sys.executable, "-c", memcg.HOG),
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        # only the job moves into the small cgroup, once it runs (denpex's analyzer may still
        # be loading its catalog: charged there, it would be the one killed)
        memcg.enter(folder, _job_once_running(run.pid, memcg.HOG, timeout_s=60))
        _, err = run.communicate(b"go\n", timeout=60)
    assert report.exists(), err.decode(errors="replace")
    diagnosis = jsonio.loads(report.read_text())
    assert run.returncode == 137 and diagnosis["root_cause"]["category"] == "host.oom_killed"
    sources = {entry["source"] for entry in diagnosis["timeline"]}
    assert "ebpf.oom" in sources, diagnosis["notes"]
    assert any("from the node agent" in note for note in diagnosis["notes"])
