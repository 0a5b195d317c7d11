"""A real Slurm cluster on loopback for the tests: munged with its own key and socket, one
slurmctld and several slurmd emulating nodes (`slurmd -N nX`, multiple-slurmd), all in the
foreground under this process so that stop() ends every daemon it started.

Needs Debian's slurmctld, slurmd, slurm-client and munge (scripts/system-packages.txt).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "scontrol", "sinfo", "sbatch")


def missing() -> list[str]:
    return [name for name in DAEMONS if shutil.which(name) is None]


def free_ports(n: int) -> list[int]:
    """n consecutive free TCP ports on loopback (slurm.conf names node ports as a range)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + n >= 65535:
            continue
        ok = True
        for port in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return list(range(base, base + n))
    raise RuntimeError("no run of free ports on loopback")


class SlurmCluster:
    def __init__(
        self,
        root: Path,
        nodes: int = 3,
        partition: str = "gpu",
        *,
        prefix: str = "n",
        first: int = 1,
    ) -> None:
        """Nodes `<prefix><first>` … (n1, n2, n3 by default; another test names them after
        its own hosts, so that a drain of host X is a drain of Slurm node X)."""
        self.root = root
        self.prefix, self.first = prefix, first
        self.nodes = [f"{prefix}{i}" for i in range(first, first + nodes)]
        self.partition = partition
        self.conf = root / "slurm.conf"
        self.procs: list[subprocess.Popen] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write_conf(self) -> None:
        ports = free_ports(len(self.nodes) + 1)
        ctld_port, node_ports = ports[0], ports[1:]
        host = socket.gethostname()
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        r = self.root
        node_list = f"{self.prefix}[{self.first}-{self.first + len(self.nodes) - 1}]"
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=denpextest",
                    f"SlurmctldHost={host}(127.0.0.1)",
                    f"SlurmctldPort={ctld_port}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={r / 'munge.socket'}",
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmdSpoolDir={r / 'spool'}/%n",
                    f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
                    f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={r / 'log' / 'slurmd-%n.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "ReturnToService=2",
                    "JobRequeue=1",
                    "SchedulerType=sched/builtin",
                    "MpiDefault=none",
                    "SwitchType=switch/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "MinJobAge=600",
                    "SlurmdTimeout=30",
                    "InactiveLimit=0",
                    "KillWait=5",
                    f"NodeName={node_list} NodeHostname={host} NodeAddr=127.0.0.1 "
                    f"Port=[{node_ports[0]}-{node_ports[-1]}] CPUs=1 RealMemory=256 State=UNKNOWN",
                    f"PartitionName={self.partition} Nodes={node_list} Default=YES "
                    "MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )

    def _spawn(self, *argv: str) -> None:
        out = self.root / "log" / f"{Path(argv[0]).name}-{len(self.procs)}.out"
        with open(out, "wb") as log:
            self.procs.append(
                subprocess.Popen(
                    list(argv),
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        self._write_conf()
        r = self.root
        key = r / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}", "--force"], check=True)
        key.chmod(0o600)
        self._spawn(
            "munged",
            "--foreground",
            "--force",
            f"--socket={r / 'munge.socket'}",
            f"--key-file={key}",
            f"--pid-file={r / 'munged.pid'}",
            f"--log-file={r / 'log' / 'munged.log'}",
            f"--seed-file={r / 'munge.seed'}",
        )
        self._wait(lambda: (r / "munge.socket").exists(), 10, "munged")
        self._spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
        self._wait(lambda: self.scontrol("ping").returncode == 0, timeout, "slurmctld")
        for node in self.nodes:
            (r / "spool" / node).mkdir(parents=True, exist_ok=True)
            self._spawn("slurmd", "-D", "-N", node, "-f", str(self.conf))
        self._wait(self._all_idle, timeout, "slurmd nodes idle")
        return self

    def _all_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return len(states) == len(self.nodes) and all(s == "idle" for s in states.values())

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[0]} exited {proc.returncode}: {self.logs()}")
            time.sleep(0.3)
        raise RuntimeError(f"{what} not ready within {timeout} s: {self.logs()}")

    def logs(self) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def scontrol(self, *args: str) -> subprocess.CompletedProcess:
        return self.run("scontrol", *args)

    def sbatch(self, script: str, *options: str) -> str:
        path = self.root / f"job-{time.monotonic_ns()}.sh"
        path.write_text(script)
        done = self.run("sbatch", "--parsable", f"--chdir={self.root}", *options, str(path))
        if done.returncode != 0:
            raise RuntimeError(f"sbatch: {done.stderr}")
        return done.stdout.strip().split(";")[0]

    def _leftovers(self) -> list[int]:
        """Processes of this cluster outside the daemons' groups (slurmstepd and job steps
        start sessions of their own): they carry our SLURM_CONF in their environment."""
        mark = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                env = (entry / "environ").read_bytes()
            except OSError:
                continue
            if mark in env.split(b"\0"):
                found.append(int(entry.name))
        return found

    def stop(self) -> None:
        if self.procs:
            self.run("scancel", "--full", "--state=running", "--user=root", timeout=15)
            self.run("scancel", "--user=root", timeout=15)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + 15
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        self.procs.clear()
        for pid in self._leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
