"""`denpex audit export|verify|head` end to end on a real store: the administrative acts are
in the chain, an intact export verifies (exit 0), a tampered one names its first bad line
(exit 1), a rewritten tail fails the site key's signature, and a kept anchor catches a cut."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from denpex.core import audit, signing


def denpex(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "denpex", *args],
        input=stdin,
        capture_output=True,
        timeout=120,
    )


def test_export_verify_and_tampering(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'cp.db'}"
    for tenant in ("acme", "blue"):
        made = denpex("server", "token", "--db", db, "--tenant", tenant, "--role", "operator")
        assert made.returncode == 0, made.stderr
    key = signing.generate_keypair()
    (tmp_path / "site.key").write_text(signing.format_secret_key(key))
    (tmp_path / "site.pub").write_text(signing.format_public_key(key.public_key()))
    kept = denpex("audit", "head", "--db", db, "--sign-key", str(tmp_path / "site.key"))
    assert kept.returncode == 0
    (tmp_path / "head.json").write_bytes(kept.stdout)

    exported = denpex("audit", "export", "--db", db, "--sign-key", str(tmp_path / "site.key"))
    assert exported.returncode == 0, exported.stderr
    lines = exported.stdout.splitlines()
    kinds = [audit.loads_record(line).get("kind") for line in lines[:-1]]
    assert kinds == ["token.created", "token.created"]
    path = tmp_path / "audit.jsonl"
    path.write_bytes(exported.stdout)
    pub = ("--pubkey", str(tmp_path / "site.pub"))
    ok = denpex("audit", "verify", str(path), *pub, "--anchor", str(tmp_path / "head.json"))
    assert ok.returncode == 0 and b"intact: 2 records" in ok.stdout, ok.stderr
    assert denpex("audit", "verify", "--db", db).returncode == 0

    changed = exported.stdout.replace(b'"tenant":"blue"', b'"tenant":"blux"')
    bad = denpex("audit", "verify", "-", stdin=changed)
    assert bad.returncode == 1 and b"line 2" in bad.stderr and b"changed" in bad.stderr

    # drop the last record and anchor the shorter chain anew, without the site key
    head = audit.head_of(audit.loads_record(lines[0]))
    forged = lines[0] + b"\n" + audit.anchor_line(head, None) + b"\n"
    assert denpex("audit", "verify", "-", stdin=forged).returncode == 0  # consistent alone
    unsigned = denpex("audit", "verify", "-", *pub, stdin=forged)
    assert unsigned.returncode == 1 and b"not signed" in unsigned.stderr
    cut = denpex("audit", "verify", "-", "--anchor", str(tmp_path / "head.json"), stdin=forged)
    assert cut.returncode == 1 and b"kept anchor" in cut.stderr

    assert denpex("audit", "verify").returncode == 2
