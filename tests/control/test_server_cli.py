"""`denpex server token` and `denpex server revoke` as a person runs them."""

from __future__ import annotations

import subprocess
import sys

from denpex.control.db import Database
from denpex.control.store import Store
from denpex.enterprise import AuthError, authenticate


def denpex(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "denpex", "server", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_token_is_printed_once_and_works(tmp_path):
    url = f"sqlite:///{tmp_path / 'cp.db'}"
    made = denpex("token", "--db", url, "--tenant", "research", "--role", "operator")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("dpx_") and len(made.stdout.splitlines()) == 1
    assert "shown only now" in made.stderr and token not in made.stderr
    db = Database(url)
    try:
        store = Store(db)
        principal = authenticate({"Authorization": f"Bearer {token}"}, store)
        assert (principal.tenant, principal.role) == ("research", "operator")
        with db.system_tx() as conn:
            stored = conn.exec_driver_sql("SELECT secret_hash FROM tokens").scalar()
        assert token.split("_", 2)[2] not in stored  # only a hash of the secret is kept
        revoked = denpex("revoke", "--db", url, token.split("_")[1])
        assert revoked.returncode == 0, revoked.stderr
        try:
            authenticate({"Authorization": f"Bearer {token}"}, store)
        except AuthError as exc:
            assert exc.status == 401
        else:
            raise AssertionError("a revoked token still authenticates")
    finally:
        db.dispose()
    again = denpex("revoke", "--db", url, token.split("_")[1])
    assert again.returncode == 2 and "no active token" in again.stderr


def test_bad_arguments_are_one_line_errors(tmp_path):
    bad_role = denpex("token", "--db", "sqlite:///x.db", "--tenant", "t", "--role", "root")
    assert bad_role.returncode == 2 and "invalid choice" in bad_role.stderr
    bad_url = denpex("token", "--db", "mysql://x", "--tenant", "t", "--role", "viewer")
    assert bad_url.returncode == 2
    assert "expected sqlite:///PATH or postgresql://" in bad_url.stderr
    assert "Traceback" not in bad_url.stderr


def test_a_bad_topology_file_is_a_one_line_error(tmp_path):
    url = f"sqlite:///{tmp_path / 'cp.db'}"
    missing = denpex("--db", url, "--topology", str(tmp_path / "none.yaml"))
    assert missing.returncode == 2 and "none.yaml" in missing.stderr
    bad = tmp_path / "site.yaml"
    bad.write_text("hosts: {node1: {leaf: s1}}\n")
    wrong = denpex("--db", url, "--topology", str(bad))
    assert wrong.returncode == 2 and "hosts.node1 takes only" in wrong.stderr
    assert "Traceback" not in missing.stderr + wrong.stderr


def test_the_spares_preflight_is_read_from_a_file_and_a_bad_one_is_a_one_line_error(tmp_path):
    from denpex.cli.server import _spare_checks

    site = tmp_path / "checks.yaml"
    site.write_text(
        "checks:\n"
        "  - {name: health, command: [site-health, --node, '{host}'], explain: the site's agent}\n"
    )
    (check,) = _spare_checks(str(site))
    assert (check.name, check.command) == ("health", ("site-health", "--node", "{host}"))
    url = f"sqlite:///{tmp_path / 'cp.db'}"
    empty = tmp_path / "empty.yaml"
    empty.write_text("checks: []\n")
    none = denpex("--db", url, "--spare-checks", str(empty))
    assert none.returncode == 2 and "a spare would pass unchecked" in none.stderr
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("preflight: []\n")
    bad = denpex("--db", url, "--spare-checks", str(wrong))
    assert bad.returncode == 2 and "want checks:" in bad.stderr
    assert "Traceback" not in none.stderr + bad.stderr
