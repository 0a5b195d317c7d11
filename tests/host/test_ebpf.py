"""The ebpf collector: pure decoders and builders on hand-made records, then the real
programs on this kernel (root, BTF, libbpf): scheduler aggregates, an exit, a real OOM kill
in a v1 memory cgroup, TCP retransmits over a veth pair, and uprobes on a fake libnccl."""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import given, seed
from hypothesis import strategies as st

from denpex.core.collector import CollectContext
from denpex.core.roots import Roots
from denpex.core.wire import Registration
from denpex.host.ebpf import layouts as L
from denpex.host.ebpf.collector import EbpfCollector
from denpex.host.ebpf.events import exit_event, hang_evidence, oom_observations
from denpex.host.ebpf.targets import (
    cgroup_path_by_inode,
    descendants,
    is_under,
    mapped_libraries,
    missing_privileges,
)
from tests import memcg, netns_dir
from tests.host.ebpf_support import REPO, bpf_unavailable, built_dir, have

FIXTURES = Path(__file__).parent / "fixtures"
WHY_NOT = bpf_unavailable()
needs_bpf = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")


# -- pure: decoders, builders, targets ---------------------------------------------------


def _exit_bytes(status: int, comm: bytes = b"python") -> bytes:
    rec = L.SchedExitEvent(ts_ns=5, pid=42, tgid=42, ppid=1, exit_code=status, comm=comm)
    return bytes(rec)


def test_decode_exit_code_and_signal() -> None:
    ex = L.decode_exit(_exit_bytes(3 << 8))
    assert (ex.pid, ex.tgid, ex.ppid, ex.comm, ex.exit_code, ex.signal) == (
        42, 42, 1, "python", 3, None,
    )  # fmt: skip
    killed = L.decode_exit(_exit_bytes(9))
    assert (killed.exit_code, killed.signal, killed.core_dumped) == (None, 9, False)
    dumped = L.decode_exit(_exit_bytes(11 | 0x80))
    assert (dumped.signal, dumped.core_dumped) == (11, True)
    with pytest.raises(ValueError):
        L.decode_exit(b"\0" * 10)


@seed(20261130)
@given(
    pid=st.integers(1, 2**22),
    kb=st.tuples(*[st.integers(0, 2**40)] * 4),
    comm=st.binary(min_size=0, max_size=15).filter(lambda b: b"\0" not in b),
)
def test_decode_oom_roundtrip(pid: int, kb: tuple[int, int, int, int], comm: bytes) -> None:
    rec = L.OomVictimEvent(
        ts_ns=1, memcg_ino=77, cgroup2_ino=5, total_vm_kb=kb[0], anon_rss_kb=kb[1],
        file_rss_kb=kb[2], shmem_rss_kb=kb[3], pid=pid, tgid=pid, uid=0, oom_score_adj=-5,
        comm=comm,
    )  # fmt: skip
    victim = L.decode_oom(bytes(rec))
    assert victim.pid == pid and victim.memcg_ino == 77 and victim.oom_score_adj == -5
    assert victim.rss_bytes == (kb[1] + kb[2] + kb[3]) * 1024
    assert victim.comm == comm.decode(errors="replace")


@seed(20261130)
@given(
    v4=st.tuples(st.ip_addresses(v=4), st.ip_addresses(v=4)),
    v6=st.tuples(st.ip_addresses(v=6), st.ip_addresses(v=6)),
    ports=st.tuples(st.integers(0, 65535), st.integers(0, 65535)),
)
def test_decode_flow_both_families(v4, v6, ports) -> None:
    for family, (src, dst) in ((L.AF_INET, v4), (L.AF_INET6, v6)):
        key = L.TcpFlowKey(sport=ports[0], dport=ports[1], family=family)
        ctypes.memmove(key.saddr, src.packed, len(src.packed))
        ctypes.memmove(key.daddr, dst.packed, len(dst.packed))
        flow = L.decode_flow(key)
        assert (flow.saddr, flow.daddr) == (str(src), str(dst))
        assert (flow.sport, flow.dport) == ports
        assert flow.family == ("ipv4" if family == L.AF_INET else "ipv6")


def test_exit_event_and_oom_evidence_carry_job() -> None:
    job = {"job": "j7", "rank": 3, "tenant": "acme"}
    ev = exit_event(L.decode_exit(_exit_bytes(9)), "node1", 123, job)
    assert (ev.kind, ev.source, ev.pid, ev.job, ev.rank, ev.tenant) == (
        "state", "ebpf.sched", 42, "j7", 3, "acme",
    )  # fmt: skip
    assert ev.attrs["signal"] == 9 and "killed by signal 9" in ev.body
    victim = L.decode_oom(bytes(L.OomVictimEvent(pid=9, tgid=9, anon_rss_kb=2048, comm=b"x")))
    event, evidence = oom_observations(victim, "node1", 5, "/slurm/job_1", job)
    assert event.attrs["cgroup"] == "/slurm/job_1" and event.attrs["rss_bytes"] == 2 * 2**20
    assert evidence.category == "host.oom_killed" and evidence.severity == "critical"
    assert evidence.signature == "host.oom_killed.oom_victim" and evidence.event.job == "j7"
    hang = hang_evidence(event, 9, "ncclGroupEnd", 400.0, 300.0)
    assert hang.category == "train.hang" and hang.action == "run_diagnostics"


def test_targets_from_fixture_proc() -> None:
    roots = Roots(procfs=str(FIXTURES / "ebpf_proc"))
    assert descendants(roots, [100]) == {100: 100, 101: 100, 102: 100}
    assert descendants(roots, [999]) == {}
    maps = (FIXTURES / "ebpf_proc" / "102" / "maps").read_text()
    assert mapped_libraries(maps) == {
        "/usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5",
        "/opt/cuda/lib64/libcuda.so.550.54",
    }
    assert is_under("/slurm/job_1/step_0", "/slurm/job_1")
    assert not is_under("/slurm/job_10", "/slurm/job_1")


def test_privileges_from_capeff() -> None:
    assert missing_privileges(None, 0) is None
    bpf_perfmon = f"CapEff:\t{(1 << 38 | 1 << 39):016x}\n"
    assert missing_privileges(bpf_perfmon, 1000) is None
    assert "CAP_BPF" in (missing_privileges(f"CapEff:\t{1 << 39:016x}\n", 1000) or "")
    assert "CAP_BPF" in (missing_privileges("Name: x\n", 1000) or "")


def test_cgroup_by_inode(tmp_path: Path) -> None:
    (tmp_path / "slurm" / "job_1").mkdir(parents=True)
    ino = (tmp_path / "slurm" / "job_1").stat().st_ino
    assert cgroup_path_by_inode(tmp_path, ino) == "/slurm/job_1"
    assert cgroup_path_by_inode(tmp_path, tmp_path.stat().st_ino) == "/"
    assert cgroup_path_by_inode(tmp_path, 1) is None


def test_available_names_each_missing_piece(tmp_path: Path) -> None:
    roots = Roots(procfs=str(tmp_path / "proc"), sysfs=str(tmp_path / "sys"))
    ok, why = EbpfCollector(roots, {"bpf_dir": str(tmp_path / "none")}).available()
    assert not ok
    assert "not built" in why and "bpf/build.py" in why and "BTF" in why


# -- real BPF on this kernel -----------------------------------------------------------


@pytest.fixture(scope="module")
def objects_dir(tmp_path_factory) -> Path:
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    return built_dir(tmp_path_factory.mktemp("ebpf"))


def _collector(objects_dir: Path, **options) -> EbpfCollector:
    collector = EbpfCollector(Roots(), {"bpf_dir": str(objects_dir), **options})
    ok, why = collector.available()
    assert ok, why
    return collector


def _poll(collector: EbpfCollector, jobs: list[Registration]) -> list:
    return collector.collect(CollectContext(Roots(), "testhost", jobs))


def _metrics(obs: list, name: str) -> list:
    return [o for o in obs if getattr(o, "kind", None) == "metric" and o.body == name]


@needs_bpf
def test_all_programs_load_and_attach(objects_dir: Path) -> None:
    collector = _collector(objects_dir)
    try:
        started = time.perf_counter()
        obs = _poll(collector, [])
        elapsed = time.perf_counter() - started
        assert collector.program_errors == {}
        attached = {o.attrs["program"] for o in _metrics(obs, "ebpf_program_attached")}
        assert attached == set(collector.enabled_programs())
        print(f"open+load+attach of {len(attached)} programs: {elapsed * 1000:.0f} ms")
    finally:
        collector.close()


@needs_bpf
def test_broken_object_is_reported_and_others_run(objects_dir: Path, tmp_path: Path) -> None:
    for name in ("sched", "pagefault"):
        (tmp_path / f"{name}.bpf.o").write_bytes((objects_dir / f"{name}.bpf.o").read_bytes())
    (tmp_path / "oom.bpf.o").write_bytes(b"not an ELF file")
    collector = _collector(tmp_path, programs=["sched", "oom", "pagefault"])
    try:
        obs = _poll(collector, [])
        assert set(collector.objects) == {"sched", "pagefault"}
        failed = [o for o in obs if o.kind == "state" and o.attrs.get("program") == "oom"]
        assert failed and "bpf_object__open_mem" in failed[0].attrs["reason"]
    finally:
        collector.close()


BUSY = "import os, time\nt = time.time()\nwhile time.time() - t < {s}:\n    time.sleep(0.0005)\nos._exit({code})"


@needs_bpf
def test_sched_aggregates_and_exit_code(objects_dir: Path) -> None:
    collector = _collector(objects_dir, programs=["sched", "pagefault"])
    child = subprocess.Popen([sys.executable, "-c", BUSY.format(s=1.5, code=3)])
    jobs = [Registration(pid=child.pid, job="train-1", rank=2, tenant="acme")]
    try:
        _poll(collector, jobs)
        time.sleep(0.7)
        obs = _poll(collector, jobs)
        waits = _metrics(obs, "ebpf_runqueue_waits_total")
        assert waits and waits[0].pid == child.pid and waits[0].job == "train-1"
        assert waits[0].attrs["value"] > 100  # ~2000 sleeps/s, each a wakeup
        offcpu = _metrics(obs, "ebpf_offcpu_seconds_total")[0].attrs["value"]
        assert 0.1 < offcpu < 5.0
        assert child.wait(10) == 3
        time.sleep(0.05)
        exits = [o for o in _poll(collector, jobs) if o.kind == "state"]
        assert len(exits) == 1
        ex = exits[0]
        assert (ex.pid, ex.attrs["exit_code"], ex.job, ex.rank) == (child.pid, 3, "train-1", 2)
    finally:
        child.kill()
        collector.close()


def _kernel_oom_report(pid: int) -> int | None:
    """anon-rss (kB) of `Killed process <pid>` in the kernel log, or None."""
    try:
        text = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.findall(rf"Killed process {pid} \(.*?anon-rss:(\d+)kB", text)
    return int(found[-1]) if found else None


@needs_bpf
@pytest.mark.skipif(memcg.unavailable_reason() is not None, reason=str(memcg.unavailable_reason()))
def test_real_oom_kill_in_memory_cgroup(objects_dir: Path) -> None:
    collector = _collector(objects_dir, programs=["oom"])
    try:
        with memcg.memory_cgroup(32 << 20) as (folder, cgroup):
            _poll(collector, [])
            child = subprocess.Popen([sys.executable, "-c", memcg.HOG], stdin=subprocess.PIPE)
            memcg.enter(folder, child.pid)
            jobs = [Registration(pid=child.pid, job="train-oom", rank=0)]
            _poll(collector, jobs)  # remember the pid before it dies
            child.communicate(b"go\n", timeout=30)
            assert child.returncode == -9
            time.sleep(0.05)
            obs = _poll(collector, jobs)
    finally:
        collector.close()
    states = [o for o in obs if getattr(o, "kind", None) == "state" and o.pid == child.pid]
    assert states, [getattr(o, "body", o) for o in obs]
    victim = states[0]
    assert victim.attrs["cgroup"] == cgroup and victim.job == "train-oom"
    # pages touched before joining the cgroup stay charged to the parent: above 32 MiB
    assert 16 << 20 < victim.attrs["anon_rss_bytes"] <= 64 << 20
    assert victim.attrs["rss_bytes"] >= victim.attrs["anon_rss_bytes"]
    reported = _kernel_oom_report(child.pid)  # the kernel's own numbers, when readable
    if reported is not None:
        assert victim.attrs["anon_rss_bytes"] == reported * 1024
    evidence = [o for o in obs if getattr(o, "category", "") == "host.oom_killed"]
    assert evidence and evidence[0].severity == "critical"


SERVER = """import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0)); s.listen(1); print(s.getsockname()[1], flush=True)
c, _ = s.accept()
while c.recv(65536):
    pass
"""
CLIENT = """import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
print(c.getsockname()[1], flush=True)
c.settimeout(0.2)
end = time.time() + 8
while time.time() < end:
    try:
        c.send(b"x" * 4096)
    except (socket.timeout, OSError):
        pass
    time.sleep(0.01)
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@needs_bpf
@pytest.mark.skipif(not have("ip"), reason="needs iproute2 (ip) for network namespaces")
def test_tcp_retransmits_over_veth_with_peer_down(objects_dir: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    ns_a, ns_b, veth_a, veth_b = f"dpxA{tag}", f"dpxB{tag}", f"dpxa{tag}", f"dpxb{tag}"
    subnet = f"10.{200 + int(tag[:2], 16) % 50}.{int(tag[2:4], 16)}"
    procs: list[subprocess.Popen] = []
    collector = _collector(objects_dir, programs=["tcpretrans"], tcp_retransmits_per_poll=2)
    before = netns_dir.snapshot()
    try:
        _ip("netns", "add", ns_a)
        _ip("netns", "add", ns_b)
        _ip("link", "add", veth_a, "type", "veth", "peer", "name", veth_b)
        for ns, dev, host in ((ns_a, veth_a, 1), (ns_b, veth_b, 2)):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{subnet}.{host}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", ns_b, sys.executable, "-c", SERVER, f"{subnet}.2"],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(server)
        port = int(server.stdout.readline())
        client = subprocess.Popen(
            ["ip", "netns", "exec", ns_a, sys.executable, "-c", CLIENT, f"{subnet}.2", str(port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(client)
        sport = int(client.stdout.readline())
        _poll(collector, [])
        time.sleep(0.3)
        _ip("-n", ns_b, "link", "set", veth_b, "down")  # the peer vanishes mid-stream
        time.sleep(2.5)
        obs = _poll(collector, [])
        flows = [
            m
            for m in _metrics(obs, "ebpf_tcp_retransmits_total")
            if m.attrs["dport"] == str(port) and m.attrs["sport"] == str(sport)
        ]
        assert flows, [getattr(o, "attrs", o) for o in obs]
        flow = flows[0]
        assert flow.attrs["saddr"] == f"{subnet}.1" and flow.attrs["daddr"] == f"{subnet}.2"
        assert flow.attrs["family"] == "ipv4" and flow.attrs["value"] >= 2
        evidence = [o for o in obs if getattr(o, "category", "") == "net.socket_error"]
        # the program sees the whole host: other flows may retransmit too, and rank first
        ours = [
            e
            for e in evidence
            if (e.captures["sport"], e.captures["dport"]) == (str(sport), str(port))
        ]
        assert ours, evidence
        time.sleep(0.3)
        again = _metrics(_poll(collector, []), "ebpf_tcp_retransmits_total")
        assert all(m.attrs["value"] > flow.attrs["value"] for m in again)  # deltas only
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        collector.close()
        for ns in (ns_a, ns_b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        netns_dir.restore(before)


DRIVER = """import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    ms = int(line)
    getattr(lib, sys.argv[2])(None, None, ctypes.c_size_t(ms), 0, 0, None, None)
    print("done", flush=True)
"""


@pytest.fixture(scope="module")
def fake_nccl(tmp_path_factory) -> Path:
    if not have("gcc"):
        pytest.skip("needs gcc to build the fake libnccl")
    lib = tmp_path_factory.mktemp("nccl") / "libnccl.so.2"
    source = REPO / "tests" / "fakes" / "nccl" / "fake_nccl.c"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(source)], check=True)
    return lib


@needs_bpf
def test_collective_uprobes_see_blocked_call(objects_dir: Path, fake_nccl: Path) -> None:
    collector = _collector(objects_dir, programs=["collective"], collective_hang_s=0.5)
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(fake_nccl), "ncclAllReduce"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    jobs = [Registration(pid=driver.pid, job="train-9", rank=5)]
    try:
        assert driver.stdout.readline().strip() == "ready"
        idle = _metrics(_poll(collector, jobs), "ebpf_oldest_collective_age_seconds")
        assert [m.attrs["value"] for m in idle] == [0.0]  # attached (found in maps), idle
        driver.stdin.write("1500\n")
        driver.stdin.flush()
        time.sleep(0.8)
        obs = _poll(collector, jobs)
        age = _metrics(obs, "ebpf_oldest_collective_age_seconds")
        assert len(age) == 1 and age[0].pid == driver.pid and age[0].rank == 5
        assert age[0].attrs["function"] == "ncclAllReduce"
        assert 0.6 < age[0].attrs["value"] < 1.5
        hangs = [o for o in obs if getattr(o, "category", "") == "train.hang"]
        assert len(hangs) == 1 and hangs[0].captures["function"] == "ncclAllReduce"
        assert driver.stdout.readline().strip() == "done"
        after = _metrics(_poll(collector, jobs), "ebpf_oldest_collective_age_seconds")
        assert [m.attrs["value"] for m in after] == [0.0]  # the return cleared it
    finally:
        driver.kill()
        driver.wait()
        collector.close()


@needs_bpf
def test_collective_library_from_option(objects_dir: Path, fake_nccl: Path) -> None:
    collector = _collector(
        objects_dir, programs=["collective"], collective_libraries=[str(fake_nccl)]
    )
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(fake_nccl), "ncclBroadcast"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        _poll(collector, [])  # attaches from the option: no job registered
        assert driver.stdout.readline().strip() == "ready"
        driver.stdin.write("800\n")
        driver.stdin.flush()
        time.sleep(0.4)
        age = _metrics(_poll(collector, []), "ebpf_oldest_collective_age_seconds")
        assert [(m.pid, m.attrs["function"]) for m in age] == [(driver.pid, "ncclBroadcast")]
        assert age[0].job is None
    finally:
        driver.kill()
        driver.wait()
        collector.close()
