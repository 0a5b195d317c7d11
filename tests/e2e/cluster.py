"""A small cluster on this machine for the drill: four "hosts", each a network namespace on
one bridge (10.215.<n>.11-14, the bridge .1) with its own UTS name, its own `denpex agent`
(its kernel log a FIFO the test writes: the agent's fixture kernel-log source) shipping to
one `denpex server` on the bridge; and a 4-rank job under `denpex run` across them. The
hosts are also the nodes of a real Slurm cluster on loopback (slurmctld and an emulated
slurmd per host, tests/remediation/slurm_cluster.py), the server's remediation backend, so a
cordon the policy allows is a drain that `scontrol show node` shows.

Everything is made by the test and removed in `close()` (processes by their pids,
namespaces, links), also when the test fails. Needs root, `ip`, `unshare`.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from denpex.core import jsonio
from denpex.core.kmsg import TEST_KMSG_ENV, TEST_MARKER, KmsgRecord, format_record
from tests import netns_dir
from tests.control.conftest import mint
from tests.remediation.slurm_cluster import SlurmCluster
from tests.remediation.slurm_cluster import missing as slurm_missing

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("drill_worker.py")
HOSTS = 4
TENANT = "drill"


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"the {tool} command is missing"
    try:
        import torch  # noqa: F401
    except ImportError:
        return "needs torch (CPU) for the gloo job"
    lacking = slurm_missing()
    if lacking:
        return f"needs Slurm and munge ({', '.join(lacking)}; scripts/system-packages.txt)"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        tag = f"{os.getpid() % 1000}{random.randrange(100):02d}"
        self.subnet = random.randrange(1, 250)
        self.bridge = f"dxb{tag}"
        self.namespaces = [f"dxd{tag}h{i}" for i in range(HOSTS)]
        self.links = [f"dxv{tag}{i}" for i in range(HOSTS)]  # host ends, on the bridge
        self.hosts = [f"drill-node{i}" for i in range(HOSTS)]
        self.addresses = [f"10.215.{self.subnet}.{11 + i}" for i in range(HOSTS)]
        self.gateway = f"10.215.{self.subnet}.1"
        self.port = 20000 + random.randrange(20000)
        self.server_url = f"http://{self.gateway}:{self.port}"
        self.db = f"sqlite:///{root / 'control.db'}"
        self.processes: list[subprocess.Popen] = []
        self.kmsg_fds: list[int] = []
        self.kmsg_seq: list[int] = []  # each host's last injected kernel-log record
        self._made: list[tuple[str, str]] = []
        self._netns_before = netns_dir.snapshot()
        self.token = ""
        self.admin_token = ""
        (root / "slurm").mkdir(parents=True, exist_ok=True)
        self.slurm = SlurmCluster(root / "slurm", nodes=HOSTS, prefix="drill-node", first=0)
        assert self.slurm.nodes == self.hosts

    # -- set-up ----------------------------------------------------------------------------
    def start(self) -> Cluster:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(("link", self.bridge))
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, ns in enumerate(self.namespaces):
            _ip("netns", "add", ns)
            self._made.append(("netns", ns))
            peer = f"{self.links[i]}p"
            _ip("link", "add", self.links[i], "type", "veth", "peer", "name", peer)
            self._made.append(("link", self.links[i]))
            _ip("link", "set", peer, "netns", ns)
            _ip("-n", ns, "link", "set", peer, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "set", self.links[i], "master", self.bridge)
            _ip("link", "set", self.links[i], "up")
        # the ranks' view of /dev/kmsg (see run_job): a socket, which open() refuses
        self.no_kmsg = self.root / "no-kmsg.sock"
        socket.socket(socket.AF_UNIX).bind(str(self.no_kmsg))
        self.token = mint(self.db, TENANT, "operator")
        self.admin_token = mint(self.db, TENANT, "admin")
        (self.root / "token").write_text(self.token + "\n")
        self.slurm.start()
        self._start_server()
        for i in range(HOSTS):
            self._start_agent(i)
        return self

    def _spawn(self, argv: list[str], log: Path, **kw) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(REPO), **kw.pop("env", {})}
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.root, **kw
            )
        self.processes.append(proc)
        return proc

    def _start_server(self) -> None:
        listen = f"{self.gateway}:{self.port}"
        argv = [sys.executable, "-m", "denpex", "server", "--db", self.db, "--listen", listen]
        argv += ["--remediation-backend", "slurm"]
        self._spawn(argv, self.root / "server.log", env={"SLURM_CONF": str(self.slurm.conf)})
        self._wait(lambda: self.api("/healthz", auth=False) is not None, "server", 60)

    def _start_agent(self, i: int) -> None:
        state = self.root / f"agent{i}"
        dev = state / "dev"
        dev.mkdir(parents=True)
        os.mkfifo(dev / "kmsg")
        # held open for writing by the test: the agent never sees end of file
        self.kmsg_fds.append(os.open(dev / "kmsg", os.O_RDWR | os.O_NONBLOCK))
        self.kmsg_seq.append(0)
        config = state / "agent.yaml"
        config.write_text(
            jsonio.dumps(
                {
                    "server": {"url": self.server_url, "token_file": str(self.root / "token")},
                    "otlp": {"metrics_interval_s": 2},
                    "api": {"socket": str(state / "agent.sock")},
                },
                pretty=True,
            ).decode()
        )
        argv = [
            *("ip", "netns", "exec", self.namespaces[i]),
            *(sys.executable, "-m", "denpex", "agent", "--config", str(config)),
            *("--host", self.hosts[i], "--listen", "127.0.0.1:9478"),
            *("--state-dir", str(state), "--devfs", str(dev)),
            *("--collectors", "kmsg,proc,cgroup"),
        ]
        # its kernel log is the fixture below, never the host's: it may read marked lines
        self._spawn(argv, state / "agent.log", env={TEST_KMSG_ENV: "1"})
        sock = state / "agent.sock"
        self._wait(sock.exists, f"agent {i}", 60)

    # -- the job ---------------------------------------------------------------------------
    def run_job(
        self,
        job: str,
        control: Path,
        *,
        steps: int,
        timeout_s: float = 20,
        memcg: dict[int, Path] | None = None,
    ) -> list:
        """The 4-rank job, rank i on host i under `denpex run`, each in its own UTS name and
        mount namespace. There /dev/kmsg cannot be opened: the host's kernel log is the
        agent's fixture, which the wrapper then takes from the agent, as it takes a kernel
        log it cannot read itself."""
        control.mkdir(parents=True, exist_ok=True)
        port = str(29000 + random.randrange(5000))
        ranks = []
        for i in range(HOSTS):
            env = {
                "RANK": str(i),
                "WORLD_SIZE": str(HOSTS),
                "MASTER_ADDR": self.addresses[0],
                "MASTER_PORT": port,
                "GLOO_SOCKET_IFNAME": "eth0",
                "DRILL_DIR": str(control),
                "DRILL_STEPS": str(steps),
                "DRILL_TIMEOUT_S": str(timeout_s),
                "DENPEX_JOB": job,
                "DENPEX_SERVER_URL": self.server_url,
                "DENPEX_TOKEN": self.token,
                "DENPEX_OUTBOX": str(control / f"outbox{i}"),
                "DENPEX_AGENT_SOCKET": str(self.root / f"agent{i}" / "agent.sock"),
                "DENPEX_SERVER_TIMEOUT": "10",
            }
            argv = [
                *("ip", "netns", "exec", self.namespaces[i]),
                *("unshare", "--uts", "--mount", "sh", "-c", self._rank_shell(i, memcg), "-"),
                *(sys.executable, "-m", "denpex", "run", "--no-pty", "--linger", "1", "--"),
                *(sys.executable, str(WORKER)),
            ]
            ranks.append(self._spawn(argv, control / f"rank{i}.log", env=env))
        return ranks

    def _rank_shell(self, i: int, memcg: dict[int, Path] | None) -> str:
        """The rank's set-up before `denpex run`: its memory cgroup (the wrapper and its
        job inherit it), its hostname, its /dev/kmsg."""
        # `ip netns exec` mounts a fresh /sys without the cgroup hierarchies: the memory one
        # again, in this rank's own mount namespace
        cgroups = (
            "mount -t tmpfs cgroups /sys/fs/cgroup && mkdir /sys/fs/cgroup/memory && "
            "mount -t cgroup -o memory memory /sys/fs/cgroup/memory && "
        )
        enter = f"echo $$ > {memcg[i] / 'cgroup.procs'} && " if memcg and i in memcg else ""
        return (
            f"{cgroups}{enter}mount --bind {self.no_kmsg} /dev/kmsg && "
            f'hostname {self.hosts[i]} && exec "$@"'
        )

    def end_job(self, control: Path, ranks: list[subprocess.Popen]) -> None:
        """End a job's wrappers and every process of it (they carry its DRILL_DIR)."""
        mark = f"DRILL_DIR={control}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    os.kill(int(entry.name), signal.SIGKILL)
        for proc in ranks:
            proc.wait(30)
        for pid_file in control.glob("pid*"):
            pid_file.unlink()

    def deliver_outbox(self, i: int, control: Path) -> None:
        """What host i's reports left in its outbox (the server was out of reach), sent now,
        as the host's next report would send it."""
        code = "from denpex.control.client import ReportShipper; ReportShipper.from_env().deliver()"
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "DENPEX_SERVER_URL": self.server_url,
            "DENPEX_TOKEN": self.token,
            "DENPEX_OUTBOX": str(control / f"outbox{i}"),
            "DENPEX_SERVER_TIMEOUT": "10",
        }
        argv = ["ip", "netns", "exec", self.namespaces[i], sys.executable, "-c", code]
        subprocess.run(argv, env=env, check=True, capture_output=True, timeout=60)

    def rank_pid(self, control: Path, rank: int, timeout_s: float = 120) -> int:
        path = control / f"pid{rank}"
        self._wait(path.exists, f"rank {rank} to start", timeout_s)
        return int(path.read_text())

    def _kernel_log(self, host: int, level: int, message: str) -> None:
        """One record in host `host`'s fixture kernel log, numbered after the last one: the
        agent reads a record once, by its sequence number, as it reads /dev/kmsg."""
        self.kmsg_seq[host] += 1
        usec = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
        record = KmsgRecord(0, level, self.kmsg_seq[host], usec, "-", message)
        os.write(self.kmsg_fds[host], format_record(record))

    def link_down_line(self, host: int) -> None:
        """The line a NIC's driver writes to its kernel log when its port loses the link
        (mlx5's), in host `host`'s kernel log: a veth has no driver that says it, so the test
        says it for the port it takes down, marked like every injected line."""
        self._kernel_log(host, 4, f"mlx5_core 0000:3b:00.0 eth0: Link down {TEST_MARKER}")

    def xid(self, host: int, pid: int) -> None:
        """An Xid 79 naming `pid`, in host `host`'s kernel log (the agent's fixture source),
        marked like every line a test injects."""
        message = f"NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, GPU has fallen off the bus."
        self._kernel_log(host, 3, f"{message} {TEST_MARKER}")

    # -- the control plane -----------------------------------------------------------------
    def api(self, path: str, *, auth: bool = True) -> dict | None:
        headers = {"Authorization": f"Bearer {self.token}"} if auth else {}
        request = urllib.request.Request(self.server_url + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                return jsonio.loads(reply.read())
        except OSError:
            return None

    def _admin(self, method: str, path: str, body: dict) -> None:
        request = urllib.request.Request(
            f"{self.server_url}{path}",
            data=jsonio.dumps(body),
            headers={
                "Authorization": f"Bearer {self.admin_token}",
                "Content-Type": "application/json",
            },
            method=method,
        )
        with urllib.request.urlopen(request, timeout=10):
            pass

    def set_policy(self, policy: dict) -> None:
        """The tenant's remediation policy (an admin's act, audited like any other)."""
        self._admin("PUT", "/api/v1/remediation/policy", policy)

    def plan_of(self, incident_id: int) -> dict | None:
        """The remediation plan proposed for an incident, if any."""
        page = self.api("/api/v1/remediation/plans") or {"items": []}
        return next((p for p in page["items"] if p["incident"] == incident_id), None)

    def close_plans(self, note: str) -> None:
        """What an operator does after a drill case: every open plan rejected, the pool's
        guard reset, the nodes back in service."""
        page = self.api("/api/v1/remediation/plans") or {"items": []}
        for plan in page["items"]:
            if plan["status"] not in ("done", "rejected", "observed", "failed"):
                with contextlib.suppress(OSError):
                    self._admin(
                        "POST",
                        f"/api/v1/remediation/plans/{plan['id']}/reject",
                        {"by": "drill", "note": note},
                    )
        with contextlib.suppress(OSError):
            self._admin(
                "POST",
                "/api/v1/remediation/guards/reset",
                {"pool": self.slurm.partition, "by": "drill"},
            )
        self.resume_nodes()

    # -- the scheduler ---------------------------------------------------------------------
    def drained(self, host: str) -> bool:
        """Whether Slurm has node `host` drained or draining (`scontrol show node`)."""
        shown = self.slurm.scontrol("show", "node", host).stdout
        state = next((w for w in shown.split() if w.startswith("State=")), "")
        return "DRAIN" in state

    def resume_nodes(self) -> None:
        """Every node back in service (an operator after a drill case)."""
        for node in self.slurm.nodes:
            if self.drained(node):
                self.slurm.scontrol("update", f"nodename={node}", "state=resume")

    def resolve_all(self, note: str) -> None:
        """Resolve every open incident (an operator closing a drill case): a later case
        starts from a clean fleet, not from a GPU still suspect from the one before."""
        for incident in self.incidents():
            if incident["status"] != "resolved":
                request = urllib.request.Request(
                    f"{self.server_url}/api/v1/incidents/{incident['id']}/resolve",
                    data=jsonio.dumps({"note": note}),
                    headers={
                        "Authorization": f"Bearer {self.token}",
                        "Content-Type": "application/json",
                    },
                    method="POST",
                )
                with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=5):
                    pass

    def incidents(self) -> list[dict]:
        page = self.api("/api/v1/incidents?limit=500") or {"items": []}
        return [self.api(f"/api/v1/incidents/{i['id']}") or i for i in page["items"]]

    @staticmethod
    def _wait(ready, what: str, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}")

    # -- tear-down -------------------------------------------------------------------------
    def close(self) -> None:
        for proc in reversed(self.processes):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        for proc in reversed(self.processes):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for fd in self.kmsg_fds:
            os.close(fd)
        for kind, name in reversed(self._made):
            argv = ["ip", "link", "del", name] if kind == "link" else ["ip", "netns", "del", name]
            subprocess.run(argv, capture_output=True, timeout=30)
        netns_dir.restore(self._netns_before)
        self.slurm.stop()


@contextlib.contextmanager
def cluster(root: Path) -> Iterator[Cluster]:
    made = Cluster(root)
    try:
        yield made.start()
    finally:
        made.close()
