"""install.sh and `denpex bundle verify` on bundles with a placeholder payload (fast): the
verification rules, idempotence, rollback, the Slurm health check; the real frozen binaries
are exercised by test_bundle.py."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from denpex.core import signing
from denpex.core.bundle import BundleError, check_bundle, parse_sums
from tests.dist.bundles import (
    build_bundle,
    flip_byte,
    install,
    placeholder_payload,
    repack,
    snapshot,
    unpack,
)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("bundles")
    found: dict[str, Path] = {"key": base / "key" / "denpex-release.pub"}
    for version in ("1.0.0", "1.1.0"):
        onedir, static = placeholder_payload(base / f"payload-{version}", version)
        found[version] = build_bundle(
            base / "out", base / "key", version=version, binary_dir=onedir, static=static
        )
    onedir, static = placeholder_payload(base / "payload-other", "1.0.0")
    found["other"] = build_bundle(
        base / "other-out", base / "other-key", version="1.0.0", binary_dir=onedir, static=static
    )
    found["other-key"] = base / "other-key" / "denpex-release.pub"
    return found


@pytest.fixture
def bundle(built, tmp_path) -> Path:
    return unpack(built["1.0.0"], tmp_path / "b1")


def test_bundle_contents(bundle):
    names = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()}
    for expected in (
        "install.sh",
        "denpex/denpex",
        "denpex-static",
        "SHA256SUMS",
        "SHA256SUMS.minisig",
        "denpex-release.pub",
        "BUNDLE-INFO",
        "sbom.cdx.json",
        "systemd/denpex-agent.service",
        "systemd/denpex-server.service",
        "systemd/denpex-rgw.service",
        "objects/rgw-single-node.sh",
        "k8s/control-plane/kustomization.yaml",
        "k8s/control-plane/deployment.yaml",
        "slurm/prolog.sh",
        "slurm/epilog.sh",
        "slurm/healthcheck.sh",
        "k8s/daemonset.yaml",
        "config/agent.yaml",
    ):
        assert expected in names
    sums = parse_sums((bundle / "SHA256SUMS").read_text())
    assert set(sums) == names - {"SHA256SUMS", "SHA256SUMS.minisig"}
    import json

    bom = json.loads((bundle / "sbom.cdx.json").read_text())
    assert bom["bomFormat"] == "CycloneDX" and bom["specVersion"] == "1.5"
    kinds = {c["name"]: c for c in bom["components"]}
    assert {"denpex/denpex", "denpex-static", "CPython", "libbpf", "PyYAML"} <= set(kinds)
    assert kinds["denpex-static"]["hashes"][0]["content"] == sums["denpex-static"]


def test_install_idempotent_then_rollback(built, tmp_path):
    prefix = tmp_path / "prefix"
    b1 = unpack(built["1.0.0"], tmp_path / "b1")
    proc = install(b1, "--prefix", str(prefix), "--pubkey", str(built["key"]))
    assert proc.returncode == 0, proc.stderr
    assert os.readlink(prefix / "current") == "versions/1.0.0"
    out = subprocess.run([prefix / "bin" / "denpex", "--version"], capture_output=True, text=True)
    assert out.stdout.strip() == "denpex 1.0.0"
    assert (prefix / "etc" / "agent.yaml").exists()

    before = snapshot(prefix)
    again = install(b1, "--prefix", str(prefix))  # the pinned key is the trust anchor now
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stdout
    assert snapshot(prefix) == before

    b2 = unpack(built["1.1.0"], tmp_path / "b2")
    assert install(b2, "--prefix", str(prefix)).returncode == 0
    assert os.readlink(prefix / "current") == "versions/1.1.0"
    assert os.readlink(prefix / "previous") == "versions/1.0.0"
    rolled = install(b2, "--prefix", str(prefix), "--rollback")
    assert rolled.returncode == 0, rolled.stderr
    assert os.readlink(prefix / "current") == "versions/1.0.0"
    out = subprocess.run([prefix / "bin" / "denpex", "--version"], capture_output=True, text=True)
    assert out.stdout.strip() == "denpex 1.0.0"
    # rolling back again returns to the newer version
    assert install(b2, "--prefix", str(prefix), "--rollback").returncode == 0
    assert os.readlink(prefix / "current") == "versions/1.1.0"


TRUST_CARRIED = "--trust-carried-key"  # where a test is about something else than the key


def _rejected(bundle: Path, prefix: Path, *args: str, match: str) -> None:
    trust = () if "--pubkey" in args else (TRUST_CARRIED,)
    proc = install(bundle, "--prefix", str(prefix), *trust, *args)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REFUSED" in proc.stderr and match in proc.stderr, proc.stderr
    assert not prefix.exists(), "something was written to the prefix"


def test_flipped_byte_rejected(bundle, tmp_path):
    flip_byte(bundle / "denpex" / "denpex")
    _rejected(bundle, tmp_path / "p", match="checksum mismatch: denpex/denpex")


def test_replaced_file_rejected(bundle, tmp_path):
    (bundle / "denpex-static").write_text("#!/bin/sh\necho evil\n")
    _rejected(bundle, tmp_path / "p", match="denpex-static")


def test_unlisted_file_rejected(bundle, tmp_path):
    (bundle / "slurm" / "extra.sh").write_text("echo extra\n")
    _rejected(bundle, tmp_path / "p", match="slurm/extra.sh is in the bundle but not in SHA256SUMS")


def test_symlink_rejected(bundle, tmp_path):
    (bundle / "config" / "link").symlink_to("/etc/passwd")
    _rejected(bundle, tmp_path / "p", match="links or special files")


def test_edited_sums_rejected(bundle, tmp_path):
    flip_byte(bundle / "denpex-static")
    sums = bundle / "SHA256SUMS"
    lines = sums.read_text().splitlines()
    digest = subprocess.run(
        ["sha256sum", "denpex-static"], cwd=bundle, capture_output=True, text=True
    ).stdout.split()[0]
    sums.write_text(
        "".join(
            (f"{digest}  denpex-static" if line.endswith(" denpex-static") else line) + "\n"
            for line in lines
        )
    )
    _rejected(bundle, tmp_path / "p", "--verifier", "openssl", match="does not verify")


def test_other_key_rejected(built, tmp_path):
    # signed with another key that the bundle carries: refused against the operator's key
    other = unpack(built["other"], tmp_path / "other")
    _rejected(other, tmp_path / "p", "--pubkey", str(built["key"]), match="not the key you passed")
    # ... and against the key a previous install pinned in the prefix
    prefix = tmp_path / "pinned"
    good = unpack(built["1.0.0"], tmp_path / "good")
    assert install(good, "--prefix", str(prefix), "--pubkey", str(built["key"])).returncode == 0
    before = snapshot(prefix)
    proc = install(other, "--prefix", str(prefix))
    assert proc.returncode == 1 and "not the key this prefix trusts" in proc.stderr
    assert snapshot(prefix) == before


@pytest.mark.parametrize("verifier", ["minisign", "openssl", "python"])
def test_wrong_key_signature_rejected_by_each_verifier(built, bundle, tmp_path, verifier):
    if verifier == "minisign" and shutil.which("minisign") is None:
        pytest.skip("minisign is not installed (apt-get install minisign)")
    if verifier == "python" and not _host_python_has_cryptography():
        pytest.skip("the host python3 lacks the cryptography package")
    # the carried key is the real one, the signature is by another key
    shutil.copy(unpack(built["other"], tmp_path / "o") / "SHA256SUMS.minisig", bundle)
    _rejected(bundle, tmp_path / "p", "--verifier", verifier, match="key")
    # a valid signature whose trusted comment was edited fails too
    fresh = unpack(built["1.0.0"], tmp_path / "fresh")
    sig = fresh / "SHA256SUMS.minisig"
    lines = sig.read_text().splitlines()
    lines[2] += " edited"
    sig.write_text("\n".join(lines) + "\n")
    _rejected(fresh, tmp_path / "p", "--verifier", verifier, match="does not verify")
    # and the untouched bundle passes with this verifier
    good = unpack(built["1.0.0"], tmp_path / "good")
    proc = install(good, "--verify-only", "--verifier", verifier, "--pubkey", str(built["key"]))
    assert proc.returncode == 0, proc.stderr
    assert f"checked with {verifier}" in proc.stdout


def _host_python_has_cryptography() -> bool:
    probe = ["python3", "-I", "-c", "import cryptography"]
    return shutil.which("python3") is not None and subprocess.run(probe).returncode == 0


def test_no_verifier_refuses_unless_told(bundle, tmp_path):
    tools = tmp_path / "tools"
    tools.mkdir()
    needed = "bash env cat cp mkdir mktemp rm sed grep wc base64 head tail od tr tac cmp sort"
    needed += " comm find sha256sum uname ln mv readlink install dirname"
    for tool in needed.split():
        os.symlink(shutil.which(tool), tools / tool)
    env = {"PATH": str(tools)}
    prefix = tmp_path / "p"
    proc = install(bundle, "--prefix", str(prefix), TRUST_CARRIED, env=env)
    assert proc.returncode == 1 and "no trusted verifier" in proc.stderr
    assert not prefix.exists()
    proc = install(bundle, "--prefix", str(prefix), TRUST_CARRIED, "--i-have-verified", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "SIGNATURE NOT CHECKED" in proc.stderr


def test_kernel_warnings(bundle):
    old = install(
        bundle, "--verify-only", TRUST_CARRIED, env={"DENPEX_INSTALL_KERNEL_RELEASE": "5.10.0-21"}
    )
    assert old.returncode == 0 and "older than 5.15" in old.stderr
    no_btf = install(
        bundle, "--verify-only", TRUST_CARRIED, env={"DENPEX_INSTALL_BTF": "/nonexistent"}
    )
    assert no_btf.returncode == 0 and "without BTF" in no_btf.stderr


def test_systemd_and_slurm_files(bundle, tmp_path):
    prefix, units, slurm = tmp_path / "p", tmp_path / "units", tmp_path / "slurm"
    proc = install(
        bundle,
        "--prefix",
        str(prefix),
        TRUST_CARRIED,
        "--with-systemd",
        "--systemd-dir",
        str(units),
        "--with-slurm",
        str(slurm),
    )
    assert proc.returncode == 0, proc.stderr
    unit = (units / "denpex-agent.service").read_text()
    assert f"ExecStart={prefix}/bin/denpex agent --config {prefix}/etc/agent.yaml" in unit
    assert "@PREFIX@" not in unit
    for name in ("denpex-prolog.sh", "denpex-epilog.sh", "denpex-healthcheck.sh"):
        assert os.access(slurm / name, os.X_OK)
    assert f"{prefix}/bin/denpex" in (slurm / "denpex-healthcheck.sh").read_text()


def test_help_and_bad_usage(bundle):
    assert "TRUST" in install(bundle, "--help").stdout
    assert install(bundle, "--bogus").returncode == 2
    assert install(bundle, "--prefix", "relative/path").returncode == 2


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--db", "sqlite:////x.db"], "go with --with-server"),
        (["--with-server", "--db", "mysql://x"], "--db: sqlite"),
        (["--with-server", "--kms", "gcp:x"], "--kms: pkcs11"),
        (["--objects", "file:///srv/objects"], "go with --with-server"),
        (["--with-server", "--objects", "ftp://host/x"], "--objects: s3://"),
        (["--with-server", "--objects", "s3://b?endpoint=x'; rm -rf /"], "--objects: s3://"),
        (["--with-server", "--db", "sqlite:///x'; rm -rf /"], "--db: sqlite"),
        (["--with-server", "--listen", "nowhere"], "--listen: HOST:PORT"),
    ],
)
def test_server_options_are_checked_before_anything_is_written(bundle, tmp_path, args, says):
    prefix = tmp_path / "prefix"
    proc = install(bundle, "--prefix", str(prefix), *args)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert not prefix.exists()


def test_relative_pubkey_is_the_callers_file(built, tmp_path):
    """`--pubkey denpex-release.pub` names the operator's file in the folder install.sh runs
    from, never the key of that name inside the bundle: a bundle re-signed with another key
    (which it carries) is refused."""
    mine = tmp_path / "operator"
    mine.mkdir()
    shutil.copy(built["key"], mine / "denpex-release.pub")
    other = unpack(built["other"], tmp_path / "other")
    prefix = tmp_path / "p"
    proc = install(other, "--prefix", str(prefix), "--pubkey", "denpex-release.pub", cwd=mine)
    assert proc.returncode == 1 and "not the key you passed" in proc.stderr, proc.stderr
    assert not prefix.exists()
    good = unpack(built["1.0.0"], tmp_path / "good")
    proc = install(good, "--prefix", str(prefix), "--pubkey", "denpex-release.pub", cwd=mine)
    assert proc.returncode == 0, proc.stderr
    assert (prefix / "etc" / "denpex-release.pub").read_bytes() == built["key"].read_bytes()


def test_relative_folders_are_the_callers(bundle, tmp_path):
    here = tmp_path / "here"
    here.mkdir()
    proc = install(
        bundle, "--prefix", str(tmp_path / "p"), TRUST_CARRIED, "--with-slurm", "slurm", cwd=here
    )
    assert proc.returncode == 0, proc.stderr
    assert (here / "slurm" / "denpex-healthcheck.sh").is_file()


def test_first_install_needs_a_key_it_was_told_to_trust(bundle, tmp_path):
    prefix = tmp_path / "p"
    for args in ((), ("--verify-only",)):
        proc = install(bundle, "--prefix", str(prefix), *args)
        assert proc.returncode == 1 and "no release key to trust" in proc.stderr, proc.stderr
        assert "--trust-carried-key" in proc.stderr
        assert not prefix.exists()
    proc = install(bundle, "--prefix", str(prefix), TRUST_CARRIED)
    assert proc.returncode == 0, proc.stderr
    assert "proves the bundle intact, not who made it" in proc.stderr
    bad = install(bundle, "--pubkey", "k.pub", TRUST_CARRIED)
    assert bad.returncode == 2 and "exclude each other" in bad.stderr


def test_downgrade_refused_unless_allowed(built, tmp_path):
    prefix, key = tmp_path / "p", str(built["key"])
    new = unpack(built["1.1.0"], tmp_path / "new")
    assert install(new, "--prefix", str(prefix), "--pubkey", key).returncode == 0
    old = unpack(built["1.0.0"], tmp_path / "old")
    before = snapshot(prefix)
    proc = install(old, "--prefix", str(prefix))
    assert proc.returncode == 1 and "older than the installed 1.1.0" in proc.stderr, proc.stderr
    assert snapshot(prefix) == before
    proc = install(old, "--prefix", str(prefix), "--allow-downgrade")
    assert proc.returncode == 0, proc.stderr
    assert "downgrading from 1.1.0 to 1.0.0" in proc.stderr
    assert os.readlink(prefix / "current") == "versions/1.0.0"
    # the same version again, and going forward, need no flag
    assert install(old, "--prefix", str(prefix)).returncode == 0
    assert install(new, "--prefix", str(prefix)).returncode == 0


CRITICAL = """{
  "host": "n1",
  "evidence": [
    {
      "body": "NVRM: Xid 79",
      "category": "gpu.fallen_off_bus",
      "severity": "critical"
    }
  ]
}
"""


def test_healthcheck_dry_run(bundle, tmp_path):
    script = bundle / "slurm" / "healthcheck.sh"
    finding = tmp_path / "critical.json"
    finding.write_text(CRITICAL)
    start = time.monotonic()
    proc = subprocess.run(
        ["bash", str(script), "--dry-run", "--input", str(finding)],
        capture_output=True,
        text=True,
        timeout=30,
        env={
            **os.environ,
            "SLURMD_NODENAME": "n1",
            "DENPEX": str(Path(sys.executable).with_name("denpex")),
        },
    )
    assert time.monotonic() - start < 15
    assert proc.returncode == 1, proc.stderr
    # the finding goes to the remediation engine; the packaged policy (Observe) only records
    assert "n1 gpu.fallen_off_bus under tier observe: cordon: record" in proc.stderr
    healthy = tmp_path / "healthy.json"
    healthy.write_text('{"host": "n1", "evidence": []}\n')
    ok = subprocess.run(["bash", str(script), "--dry-run", "--input", str(healthy)], timeout=30)
    assert ok.returncode == 0
    # a binary that hangs is cut off by the timeout and never drains the node
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nsleep 30\n")
    hang.chmod(0o755)
    start = time.monotonic()
    proc = subprocess.run(
        ["bash", str(script), "--dry-run", "--timeout", "1"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "DENPEX": str(hang)},
    )
    assert time.monotonic() - start < 10
    assert proc.returncode == 0 and "timed out" in proc.stderr


# ---- the same rules in Python (denpex bundle verify)


def _verify(path: Path, pubkey: Path | None = None, as_json: bool = False, *extra: str) -> int:
    from denpex.cli import bundle as bundle_cli

    parser = argparse.ArgumentParser()
    bundle_cli.add_parser(parser.add_subparsers())
    argv = ["bundle", "verify", str(path), *extra]
    argv += ["--pubkey", str(pubkey)] if pubkey else []
    args = parser.parse_args(argv + (["--json"] if as_json else []))
    return bundle_cli.handle(args)


def test_check_bundle_good(built, bundle, capsys):
    key = signing.parse_public_key(built["key"].read_bytes())
    for target in (built["1.0.0"], bundle):
        result = check_bundle(target, key)
        assert result.origin_checked and result.files > 10
        assert result.name == "denpex-airgap-bundle-1.0.0-" + os.uname().machine
    assert _verify(built["1.0.0"], built["key"]) == 0
    assert "verified" in capsys.readouterr().out
    # the key a bundle carries proves nothing about who made it: not without being told
    assert _verify(built["1.0.0"]) == 1
    assert "no release key to trust" in capsys.readouterr().err
    with pytest.raises(BundleError, match="no release key to trust"):
        check_bundle(bundle, None)
    assert _verify(built["1.0.0"], None, False, TRUST_CARRIED) == 0
    assert "origin not proven" in capsys.readouterr().err


def test_check_bundle_bad(built, bundle, tmp_path):
    key = signing.parse_public_key(built["key"].read_bytes())
    with pytest.raises(BundleError, match="not the key you trust"):
        check_bundle(built["other"], key)
    assert _verify(built["other"], built["key"]) == 1
    flip_byte(bundle / "denpex" / "denpex")
    with pytest.raises(BundleError, match="denpex/denpex: SHA-256 differs"):
        check_bundle(repack(bundle, tmp_path / "flipped.tar.gz"), key)
    with pytest.raises(BundleError, match="denpex/denpex: SHA-256 differs"):
        check_bundle(bundle, key)
    extra = unpack(built["1.0.0"], tmp_path / "extra")
    (extra / "extra.txt").write_text("x")
    with pytest.raises(BundleError, match=r"extra\.txt: present in the bundle but not listed"):
        check_bundle(repack(extra, tmp_path / "extra.tar.gz"), None, trust_carried=True)
    wrong_sig = unpack(built["1.0.0"], tmp_path / "wrongsig")
    shutil.copy(unpack(built["other"], tmp_path / "o") / "SHA256SUMS.minisig", wrong_sig)
    with pytest.raises(BundleError, match="signed with key"):
        check_bundle(wrong_sig, None, trust_carried=True)
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(b"not a tarball")
    with pytest.raises(BundleError, match="not a readable"):
        check_bundle(garbage, key)
