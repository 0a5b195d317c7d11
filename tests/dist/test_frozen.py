"""The frozen binaries (dist_scripts/build_binary.sh) run as a user runs them: real processes.

Covers the onedir `dist/denpex/denpex`, the onefile and the static `dist/denpex-static`:
compiled backends loaded (never the fallbacks), the child's exact environment, exit status,
`env -i`, another working directory, parent death, scan, doctor and the agent. Slow: the
first test builds the binaries when they are missing (once per run; the build is cached).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "corpus"
BUILD_SCRIPT = ROOT / "dist_scripts" / "build_binary.sh"
KINDS = {"onedir": "denpex/denpex", "onefile": "denpex-onefile", "static": "denpex-static"}
# what the bootloaders (PyInstaller, staticx) add to the environment of the frozen Python
BOOTLOADER_VARIABLES = ("LD_LIBRARY_PATH_ORIG", "_PYI_", "_MEIPASS", "STATICX_")


def _build_reason() -> str | None:
    """Why the binaries cannot be built here, or None."""
    if not sys.platform.startswith("linux"):
        return "frozen binaries are built on Linux only"
    if not os.access("/usr/bin/python3", os.X_OK):
        return "no /usr/bin/python3 to build the frozen binaries from"
    if not shutil.which("apt-get") and not shutil.which("gcc"):
        return "no C compiler and no apt-get to install one"
    return None


@pytest.fixture(scope="session")
def dist() -> Path:
    """The folder holding the binaries: $DENPEX_FROZEN_DIST as is, else dist/ (re)built by
    build_binary.sh, which does nothing when no source changed since its last build."""
    given = os.environ.get("DENPEX_FROZEN_DIST")
    if given:
        return Path(given)
    folder = ROOT / "dist"
    reason = _build_reason()
    if reason is not None:
        if (folder / KINDS["onedir"]).exists():
            return folder
        pytest.skip(f"dist/denpex does not exist and cannot be built: {reason}")
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--dist", str(folder)],
        capture_output=True,
        text=True,
        timeout=1700,
    )
    if result.returncode != 0:
        pytest.fail(f"build_binary.sh failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return folder


@pytest.fixture(params=sorted(KINDS))
def binary(request, dist: Path) -> Path:
    path = dist / KINDS[request.param]
    if not path.exists():
        pytest.skip(f"{path} was not built (build_binary.sh --no-static?)")
    return path


def run(binary: Path, *args: str, env: dict[str, str] | None = None, **kwargs):
    kwargs.setdefault("timeout", 120)
    return subprocess.run([str(binary), *args], capture_output=True, text=True, env=env, **kwargs)


def test_version(binary):
    result = run(binary, "--version")
    assert result.returncode == 0, result.stderr
    from denpex import __version__

    assert result.stdout.strip() == f"denpex {__version__}"


def test_version_verbose_reports_native_backends_never_a_fallback(binary):
    result = run(binary, "--version", "--verbose", env=_clean_env())
    assert result.returncode == 0, result.stderr
    fields = dict(line.split(": ", 1) for line in result.stdout.splitlines()[1:] if ": " in line)
    assert fields["frozen"] == "yes"
    import denpex._native as native

    for name in native.NATIVE_MODULES:
        assert fields[name] == "native", f"{binary} loaded the pure-Python {name}"
    assert int(fields["signatures"]) > 100


def test_exit_status_is_the_childs(binary):
    assert run(binary, "run", "--", "sh", "-c", "exit 3").returncode == 3


@pytest.mark.parametrize("caller", ["/opt/caller/lib:/x", None], ids=["set", "unset"])
def test_child_sees_the_callers_ld_library_path(binary, caller):
    env = _clean_env()
    if caller is not None:
        env["LD_LIBRARY_PATH"] = caller
    script = 'echo "${LD_LIBRARY_PATH-<unset>}"'
    result = run(binary, "run", "--", "sh", "-c", script, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (caller if caller is not None else "<unset>")


def test_env_i_child_environment_is_exactly_the_callers(binary, tmp_path):
    """`env -i`: no HOME, no PATH; the child gets exactly what the caller had, nothing the
    bootloaders added, from another working directory."""
    result = subprocess.run(
        ["env", "-i", "A=1", "LD_LIBRARY_PATH=/l", str(binary), "run", "--", "/usr/bin/env"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert _callers_part(result.stdout) == ["A=1", "LD_LIBRARY_PATH=/l"]


def test_env_i_bare_environment_reaches_the_child_bare(binary, tmp_path):
    result = subprocess.run(
        ["env", "-i", str(binary), "run", "--", "/usr/bin/env"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert _callers_part(result.stdout) == []


def _callers_part(env_output: str) -> list[str]:
    """The child's variables less what denpex adds on purpose (DENPEX_*: the SDK socket)."""
    return sorted(line for line in env_output.splitlines() if not line.startswith("DENPEX_"))


def test_nested_frozen_denpex_runs_as_its_own_program(binary, tmp_path):
    """A frozen denpex wrapping a frozen denpex: the inner one must not take the outer
    bootloader's variables for its own."""
    result = run(binary, "run", "--", str(binary), "run", "--", "sh", "-c", "exit 4", cwd=tmp_path)
    assert result.returncode == 4, result.stderr


def _labels() -> dict[str, dict]:
    return {e["file"]: e for e in yaml.safe_load((CORPUS / "labels.yaml").read_text())}


@pytest.mark.parametrize(
    "log", ["oom_watchdog_2node.log", "host_oom_kernlog_sigkill.log", "ckpt_enospc.log"]
)
def test_scan_json_names_the_labelled_root_cause_from_env_i_and_another_cwd(binary, tmp_path, log):
    label = _labels()[log]
    shutil.copy(CORPUS / log, tmp_path / log)
    result = subprocess.run(
        ["env", "-i", str(binary), "scan", "--json", "-q", log],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert data["root_cause"]["category"] == label["category"]
    assert data == _scan_in_process(tmp_path / log, tmp_path)


def _scan_in_process(path: Path, cwd: Path) -> dict:
    """The same scan by the denpex these tests import (not frozen), for comparison."""
    result = subprocess.run(
        [sys.executable, "-m", "denpex", "scan", "--json", "-q", path.name],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )
    return json.loads(result.stdout)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_sigkill_of_denpex_kills_the_wrapped_child(binary):
    """SIGKILL to the process the caller started (for onefile/static: the outermost
    bootloader) must not leave the wrapped job running."""
    proc = subprocess.Popen(
        [str(binary), "run", "--", "sh", "-c", "echo $$; exec sleep 300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        child = int(proc.stdout.readline())
        assert _alive(child)
        leftovers = _extraction_dirs(_parent_of(child))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), f"child {child} survived SIGKILL of {binary.name}"
    finally:
        proc.kill()
        proc.wait()
    time.sleep(0.5)  # a surviving bootloader parent removes its own folder
    for folder in leftovers:  # what a killed bootloader could not remove (known, documented)
        shutil.rmtree(folder, ignore_errors=True)


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _extraction_dirs(pid: int) -> list[Path]:
    """The temporary folders the onefile/static bootloaders of the frozen `pid` unpacked into."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(item.decode().split("=", 1) for item in environ if b"=" in item)
    tmp = Path(tempfile.gettempdir())
    folders = [env.get("_PYI_APPLICATION_HOME_DIR"), env.get("STATICX_BUNDLE_DIR")]
    return [
        Path(f)
        for f in folders
        if f and Path(f).parent == tmp and Path(f).name.startswith(("_MEI", "staticx-"))
    ]


def test_doctor_runs_and_reports_native_backends(binary):
    result = run(binary, "doctor", "--json")
    assert result.returncode == 0, result.stderr
    checks = {c["check"]: c for c in json.loads(result.stdout)}
    assert "(frozen)" in checks["denpex"]["detail"]
    for name in ("linesplit", "linebatch", "matcher", "checksum", "ringbuf"):
        assert checks[f"backend {name}"]["detail"] == "native"
    assert "pip install" in checks["SDK"]["detail"]


def test_agent_once_json_runs(binary):
    result = run(binary, "agent", "--once", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["events"]


@pytest.mark.skipif(os.geteuid() != 0, reason="loading eBPF programs needs root")
@pytest.mark.skipif(
    not Path("/sys/kernel/btf/vmlinux").exists(), reason="no kernel BTF: eBPF is off"
)
def test_agent_loads_the_frozen_ebpf_objects(binary):
    result = run(binary, "agent", "--once", "--json", "--collectors", "ebpf")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert "ebpf" not in data["unavailable"], data["unavailable"].get("ebpf")
    attached = {
        e["attrs"]["program"]
        for e in data["events"]
        if e["body"] == "ebpf_program_attached" and e["attrs"]["value"] == 1
    }
    assert {"sched", "oom"} <= attached


def _clean_env() -> dict[str, str]:
    """Our environment without what a surrounding bootloader or the suite may have set."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(BOOTLOADER_VARIABLES) and k != "DENPEX_NO_EXTENSIONS"
    }
    env.pop("LD_LIBRARY_PATH", None)
    return env


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot and mounting /proc need root")
def test_static_binary_runs_on_a_root_with_nothing_installed(dist, tmp_path):
    """The drop-in for bare nodes: a root holding only the binary, /proc and a writable /tmp."""
    static = dist / KINDS["static"]
    if not static.exists():
        pytest.skip(f"{static} was not built")
    if not shutil.which("chroot"):
        pytest.skip("no chroot command")
    root = tmp_path / "root"
    for folder in ("proc", "tmp", "bin"):
        (root / folder).mkdir(parents=True)
    shutil.copy(static, root / "bin" / "denpex")
    shutil.copy(CORPUS / "oom_watchdog_2node.log", root / "tmp" / "job.log")
    subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True)
    try:
        chroot = ["env", "-i", shutil.which("chroot"), str(root), "/bin/denpex"]
        verbose = subprocess.run(
            [*chroot, "--version", "--verbose"], capture_output=True, text=True, timeout=120
        )
        assert verbose.returncode == 0, verbose.stderr
        assert "matcher: native" in verbose.stdout
        scan = subprocess.run(
            [*chroot, "scan", "--json", "-q", "/tmp/job.log"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert scan.returncode == 1, scan.stderr
        assert json.loads(scan.stdout)["root_cause"]["category"] == "cuda.oom"
        nested = subprocess.run(
            [*chroot, "run", "--", "/bin/denpex", "--version"], capture_output=True, timeout=120
        )
        assert nested.returncode == 0, nested.stderr
    finally:
        subprocess.run(["umount", str(root / "proc")], check=False)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def test_server_on_sqlite_ingests_a_report_and_serves_the_ui(binary, tmp_path):
    """`denpex server` from the frozen binary alone: migrations, the API, a job report sent by
    the frozen `denpex scan`, the UI's login page and its vendored static files."""
    db = f"sqlite:///{tmp_path / 'cp.db'}"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    minted = run(
        binary, "server", "token", "--db", db, "--tenant", "t1", "--role", "operator", env=env
    )
    assert minted.returncode == 0, minted.stderr
    token = minted.stdout.strip()
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [str(binary), "server", "--db", db, "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while _get(f"{base}/login")[0] != 200:
            assert server.poll() is None, server.stderr.read()
            assert time.monotonic() < deadline, "the frozen server never answered"
            time.sleep(0.2)
        status, page = _get(f"{base}/login")
        assert b"<title>Log in" in page and b'action="/login"' in page
        for asset in ("htmx.min.js", "denpex.css"):
            status, body = _get(f"{base}/static/{asset}")
            assert status == 200 and len(body) > 1000, asset

        log = tmp_path / "job.log"
        log.write_text("Traceback (most recent call last):\nValueError: bad shard\n")
        scan_env = {
            **env,
            "DENPEX_AGENT_URL": "off",
            "DENPEX_OUTBOX": str(tmp_path / "outbox"),
            "DENPEX_SERVER_URL": base,
            "DENPEX_TOKEN": token,
            "DENPEX_JOB": "frozen-job",
        }
        scanned = run(binary, "scan", "--quiet", str(log), env=scan_env)
        assert scanned.returncode == 1, scanned.stderr
        status, body = _get(f"{base}/api/v1/jobs", token)
        assert status == 200, body
        assert "frozen-job" in {job["job"] for job in json.loads(body)["items"]}
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_rag_folder_beside_the_binary_turns_embeddings_on(binary, dist):
    """The `rag` extra is its own folder: with it the frozen binary embeds, without it it
    says retrieval is by keywords and what to install."""
    if not (dist / "denpex-rag").is_dir():
        pytest.skip("dist/denpex-rag was not built (build_binary.sh --no-rag?)")
    env = _clean_env()
    env.pop("DENPEX_RAG_DIR", None)
    found = run(binary, "--version", "--verbose", env=env)
    assert found.returncode == 0, found.stderr
    assert "retrieval: embeddings" in found.stdout.splitlines()
    env["DENPEX_RAG_DIR"] = str(dist / "no-such-folder")
    missing = run(binary, "--version", "--verbose", env=env)
    assert missing.returncode == 0, missing.stderr
    assert "retrieval: keywords (numpy is not installed" in missing.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="loading eBPF programs needs root")
@pytest.mark.skipif(
    not Path("/sys/kernel/btf/vmlinux").exists(), reason="no kernel BTF: eBPF is off"
)
def test_frozen_agent_refuses_a_tampered_ebpf_object(dist, tmp_path):
    """The onedir's objects are signed at build time; one byte changed in one of them after
    the build and the agent refuses that program, loading the others."""
    copy = tmp_path / "denpex"
    shutil.copytree(dist / "denpex", copy, symlinks=True)
    objects = copy / "_internal" / "denpex" / "host" / "bpf"
    assert (objects / "oom.bpf.o.minisig").is_file() and (objects / "denpex-release.pub").is_file()
    data = bytearray((objects / "oom.bpf.o").read_bytes())
    data[data.rindex(b"GPL")] = ord("g")
    (objects / "oom.bpf.o").write_bytes(bytes(data))
    result = run(copy / "denpex", "agent", "--once", "--json", "--collectors", "ebpf")
    assert result.returncode == 0, result.stderr
    events = json.loads(result.stdout)["events"]
    attached = {
        e["attrs"]["program"]: e["attrs"]["value"]
        for e in events
        if e["body"] == "ebpf_program_attached"
    }
    assert attached["oom"] == 0 and attached["sched"] == 1, attached
    (failed,) = [e for e in events if e["attrs"].get("state") == "failed"]
    assert failed["attrs"]["program"] == "oom"
    assert "signature does not verify" in failed["attrs"]["reason"]
