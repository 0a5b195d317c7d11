"""The real air-gapped bundle (slow): built from the frozen binaries with a throwaway key,
installed with no network (`unshare -n`) into a temporary prefix, then used; damaged or
foreign bundles are refused and leave the prefix untouched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.control.rgw_server import missing_binaries
from tests.dist.bundles import (
    ROOT,
    build_bundle,
    flip_byte,
    install,
    placeholder_payload,
    repack,
    snapshot,
    unpack,
    unshare_works,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        not (ROOT / "dist_scripts" / "build_binary.sh").exists(),
        reason="dist_scripts/build_binary.sh (the frozen binaries) does not exist yet",
    ),
    pytest.mark.skipif(not unshare_works(), reason="`unshare -n` does not work here (needs root)"),
]
FAILING_LOG = ROOT / "tests" / "corpus" / "nccl_ib_retry_exceeded.log"


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> dict[str, Path]:
    """Reuses dist/denpex and dist/denpex-static when present; build_bundle.sh runs
    dist_scripts/build_binary.sh otherwise (minutes)."""
    base = tmp_path_factory.mktemp("real")
    tarball = build_bundle(base / "out", base / "key", version="0.0.1+test")
    onedir, static = placeholder_payload(base / "payload-other", "0.0.1+test")
    other = build_bundle(
        base / "other-out",
        base / "other-key",
        version="0.0.1+test",
        binary_dir=onedir,
        static=static,
    )
    return {"tarball": tarball, "key": base / "key" / "denpex-release.pub", "other": other}


def run(prefix: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["unshare", "-n", str(prefix / "bin" / "denpex"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_install_offline_and_use(real, tmp_path):
    bundle = unpack(real["tarball"], tmp_path / "b")
    prefix = tmp_path / "prefix"
    proc = install(bundle, "--prefix", str(prefix), "--pubkey", str(real["key"]), netns=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    version = run(prefix, "--version")
    assert version.returncode == 0 and version.stdout.startswith("denpex "), version.stderr
    assert run(prefix, "run", "--quiet", "--", "sh", "-c", "exit 3").returncode == 3
    scan = run(prefix, "scan", "--json", str(FAILING_LOG))
    assert scan.returncode == 1, scan.stderr
    assert json.loads(scan.stdout)
    doctor = run(prefix, "doctor")
    assert doctor.returncode == 0 and "signatures" in doctor.stdout, doctor.stderr
    static = subprocess.run(
        ["unshare", "-n", str(prefix / "bin" / "denpex-static"), "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert static.returncode == 0 and static.stdout == version.stdout

    before = snapshot(prefix)
    again = install(bundle, "--prefix", str(prefix), netns=True)
    assert again.returncode == 0 and snapshot(prefix) == before, again.stderr


def test_second_version_and_rollback(real, tmp_path):
    prefix = tmp_path / "prefix"
    first = unpack(real["tarball"], tmp_path / "b1")
    assert install(first, "--prefix", str(prefix), "--pubkey", str(real["key"])).returncode == 0
    # a second version: same binaries, another version number, same key
    second = build_bundle(
        tmp_path / "out2",
        real["key"].parent,
        version="0.0.2+test",
        binary_dir=first / "denpex",
        static=first / "denpex-static",
    )
    b2 = unpack(second, tmp_path / "b2")
    assert install(b2, "--prefix", str(prefix), netns=True).returncode == 0
    assert os.readlink(prefix / "current") == "versions/0.0.2+test"
    assert install(b2, "--prefix", str(prefix), "--rollback").returncode == 0
    assert os.readlink(prefix / "current") == "versions/0.0.1+test"
    assert run(prefix, "--version").returncode == 0


@pytest.mark.parametrize("damage", ["flipped-byte", "replaced-file", "unlisted-file", "wrong-key"])
def test_bad_bundles_rejected(real, tmp_path, damage):
    bundle = unpack(real["tarball"], tmp_path / "b")
    if damage == "flipped-byte":
        flip_byte(bundle / "denpex" / "denpex")
    elif damage == "replaced-file":
        shutil.copy(bundle / "denpex-static", bundle / "denpex" / "denpex")
    elif damage == "unlisted-file":
        (bundle / "denpex" / "_internal" / "sitecustomize.py").write_text("import os\n")
    else:
        bundle = unpack(real["other"], tmp_path / "other")
    # through a tarball round trip, as an operator would receive it
    bundle = unpack(repack(bundle, tmp_path / "damaged.tar.gz"), tmp_path / "received")
    prefix = tmp_path / "prefix"
    proc = install(bundle, "--prefix", str(prefix), "--pubkey", str(real["key"]), netns=True)
    assert proc.returncode == 1 and "REFUSED" in proc.stderr, proc.stdout + proc.stderr
    assert not prefix.exists()


def test_bundle_verify_from_the_binary(real, tmp_path):
    bundle = unpack(real["tarball"], tmp_path / "b")
    prefix = tmp_path / "prefix"
    assert install(bundle, "--prefix", str(prefix), "--pubkey", str(real["key"])).returncode == 0
    probe = run(prefix, "bundle", "verify", "--help")
    if probe.returncode != 0:
        pytest.skip(f"this build has no `denpex bundle verify`: {probe.stderr.strip()[-200:]}")
    good = run(prefix, "bundle", "verify", str(real["tarball"]), "--pubkey", str(real["key"]))
    assert good.returncode == 0, good.stderr
    flip_byte(bundle / "denpex-static")
    damaged = str(repack(bundle, tmp_path / "bad.tar.gz"))
    bad = run(prefix, "bundle", "verify", damaged, "--pubkey", str(real["key"]))
    assert bad.returncode == 1 and "denpex-static" in bad.stderr
    foreign = run(prefix, "bundle", "verify", str(real["other"]), "--pubkey", str(real["key"]))
    assert foreign.returncode == 1


def test_healthcheck_with_the_real_binary_is_bounded(real, tmp_path):
    bundle = unpack(real["tarball"], tmp_path / "b")
    prefix, slurm = tmp_path / "prefix", tmp_path / "slurm"
    proc = install(
        bundle, "--prefix", str(prefix), "--pubkey", str(real["key"]), "--with-slurm", str(slurm)
    )
    assert proc.returncode == 0, proc.stderr
    import time

    start = time.monotonic()
    check = subprocess.run(
        ["bash", str(slurm / "denpex-healthcheck.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - start < 10
    assert check.returncode in (0, 1), check.stderr


APPLIANCE = r"""
set -euo pipefail
ip link set lo up
ip route show | grep -q default && { echo "a route out exists" >&2; exit 9; }
DENPEX_INSTALL_SYSTEMD=0 bash "$BUNDLE/install.sh" --prefix "$PREFIX" --pubkey "$KEY" \
    --with-server --listen 127.0.0.1:19479 --kms "file://$PREFIX/var/kek.json"
pid=$(cat "$PREFIX/var/server/server.pid")
stop_all() {
    kill $pid; while kill -0 $pid 2>/dev/null; do sleep 0.1; done
    # the local RGW install.sh started for the object store, when Ceph is installed
    [[ -d "$PREFIX/var/rgw" ]] && bash "$PREFIX/current/objects/rgw-single-node.sh" stop "$PREFIX/var/rgw"
    true
}
trap stop_all EXIT
curl -sf http://127.0.0.1:19479/login >"$OUT/login.html"
curl -sf http://127.0.0.1:19479/healthz >"$OUT/healthz.json"
(set -a; . "$PREFIX/etc/server.env"; "$PREFIX/bin/denpex" server token --tenant t1 \
    --role operator) >"$OUT/token" 2>/dev/null
curl -sf -H "Authorization: Bearer $(cat "$OUT/token")" http://127.0.0.1:19479/api/v1/incidents \
    >"$OUT/incidents.json"
stat -c %a "$PREFIX/etc/server.env" >"$OUT/env-mode"
"""


def test_appliance_installs_and_serves_the_control_plane_with_no_route_out(real, tmp_path):
    """install.sh --with-server in a network namespace with only loopback: the control plane
    from the bundle's own binary (nothing fetched) migrates SQLite, serves its login page and
    answers the API with a token minted from the written server.env."""
    if shutil.which("curl") is None or shutil.which("ip") is None:
        pytest.skip("needs curl and ip (iproute2)")
    bundle = unpack(real["tarball"], tmp_path / "b")
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        ["unshare", "-n", "bash", "-c", APPLIANCE],
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **os.environ,
            "BUNDLE": str(bundle),
            "PREFIX": str(tmp_path / "prefix"),
            "KEY": str(real["key"]),
            "OUT": str(out),
        },
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "control plane on http://127.0.0.1:19479" in proc.stdout
    assert "<title>Log in" in (out / "login.html").read_text()
    assert json.loads((out / "incidents.json").read_text())["items"] == []
    assert (out / "env-mode").read_text().strip() == "600"
    env = (tmp_path / "prefix" / "etc" / "server.env").read_text()
    assert "DENPEX_SERVER_DB='sqlite:///" in env and "DENPEX_KMS='file://" in env
    # the object store install.sh bootstrapped: the local RGW where Ceph is installed, files else
    objects = json.loads((out / "healthz.json").read_text())["objects"]
    if missing_binaries():
        assert objects == "filesystem" and "object store: the filesystem" in proc.stdout
        assert "DENPEX_OBJECTS='file://" in env
    else:
        assert objects == "s3", proc.stdout
        assert "object store: S3 on Ceph RGW at http://127.0.0.1:7480" in proc.stdout
        assert "DENPEX_OBJECTS='s3://denpex/cp?endpoint=http://127.0.0.1:7480" in env
        assert "AWS_SECRET_ACCESS_KEY=" in env
