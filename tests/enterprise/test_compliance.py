"""The compliance matrix: every test it names exists, every framework and NIST family the
issue asks for is there, results come from a real pytest junit XML, and nothing is reported
as proven without a passing result (absent: "not run"; no test: "gap")."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from denpex.enterprise.compliance import junit_results, load_mapping, matrix

ROOT = Path(__file__).resolve().parents[2]


def test_every_named_test_exists_and_every_feature_is_used():
    features, controls = load_mapping()
    for control in controls:
        for node in control.tests:
            path, _, name = node.partition("::")
            tree = ast.parse((ROOT / path).read_text())
            defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert name in defined, f"{control.id}: {node} does not exist"
        assert control.tests or control.gap, f"{control.id}: no test and no gap said"
    used = {f for c in controls for f in c.features}
    assert used == set(features)
    frameworks = {c.framework for c in controls}
    assert frameworks == {"SOC 2", "ISO 27001 Annex A", "HIPAA §164.312", "NIST 800-53"}
    soc2 = {c.id.split(".")[0] for c in controls if c.framework == "SOC 2"}
    assert soc2 == {"CC6", "CC7", "CC8"}
    nist = {c.id.split("-")[0] for c in controls if c.framework == "NIST 800-53"}
    assert nist == {"AC", "AU", "IA", "SC"}


def test_results_come_from_a_real_junit_xml(tmp_path):
    junit = tmp_path / "junit.xml"
    node = "tests/enterprise/test_policy.py::test_policy_show_lists_the_set"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            node,
            f"--junitxml={junit}",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-2000:]
    assert junit_results(junit) == {node: "passed"}


def test_statuses_never_claim_more_than_the_results(tmp_path):
    _, controls = load_mapping()
    assert {r["status"] for r in matrix(controls, None)} == {"not run", "gap"}
    first = controls[0]
    cases = []
    for i, node in enumerate(first.tests):
        path, _, name = node.partition("::")
        classname = path.removesuffix(".py").replace("/", ".")
        outcome = "<failure message='boom'/>" if i == 0 else ""
        cases.append(
            f'<testcase classname="{classname}" name="{name}[sqlite]">{outcome}</testcase>'
        )
        cases.append(f'<testcase classname="{classname}" name="{name}[postgresql]"/>')
    junit = tmp_path / "junit.xml"
    junit.write_text(f"<testsuites><testsuite>{''.join(cases)}</testsuite></testsuites>")
    results = junit_results(junit)
    row = matrix([first], results)[0]
    assert row["status"] == "failing" and row["tests"][first.tests[0]] == "failed"
    junit.write_text(junit.read_text().replace("<failure message='boom'/>", ""))
    assert matrix([first], junit_results(junit))[0]["status"] == "proven"
    partial = {first.tests[0]: "passed"}
    assert matrix([first], partial)[0]["status"] == (
        "proven" if len(first.tests) == 1 else "not run"
    )
    skipped = dict.fromkeys(first.tests, "skipped")
    assert matrix([first], skipped)[0]["status"] == "not run"


def test_compliance_report_command(tmp_path):
    def report(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "denpex", "compliance", "report", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )

    markdown = report()
    assert markdown.returncode == 0
    assert "| SOC 2 | CC6.1 |" in markdown.stdout and "**not run**" in markdown.stdout
    assert "**proven**" not in markdown.stdout
    assert "none: denpex serves plain HTTP" in markdown.stdout
    missing = report("--junit", str(tmp_path / "nope.xml"))
    assert missing.returncode == 2 and "no such file" in missing.stderr
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite><testcase classname="tests.enterprise.test_kms" '
        'name="test_seal_and_open[local]"/></testsuite></testsuites>'
    )
    data = json.loads(report("--json", "--junit", str(junit)).stdout)
    rows = {(r["framework"], r["control"]): r for r in data["controls"]}
    assert rows[("HIPAA §164.312", "(a)(2)(iv)")]["status"] == "proven"
    assert rows[("NIST 800-53", "SC-8")]["status"] == "gap"
    assert rows[("SOC 2", "CC6.1")]["status"] == "not run"
