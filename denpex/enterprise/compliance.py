"""The compliance matrix: compliance.yaml maps controls (SOC 2, ISO 27001 Annex A, HIPAA
§164.312, NIST 800-53) to denpex features and to the tests that prove them; each test's last
result comes from a junit XML (scripts/test-all.sh writes one). Rendered as Markdown or JSON
by `denpex compliance report`.

It must never report a control as proven without a passing result of every test it names:
a test absent from the XML is "not run", a control with no test is a "gap".
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True, slots=True)
class Control:
    framework: str
    id: str
    title: str
    features: tuple[str, ...]
    tests: tuple[str, ...]
    gap: str | None


def load_mapping(path: str | Path | None = None) -> tuple[dict[str, str], list[Control]]:
    """(feature → explanation, controls) of the bundled mapping or of `path`."""
    if path is None:
        text = resources.files("denpex.enterprise").joinpath("compliance.yaml").read_text()
    else:
        text = Path(path).read_text()
    raw = yaml.safe_load(text)
    features = {str(k): str(v) for k, v in raw["features"].items()}
    controls = []
    for entry in raw["controls"]:
        control = Control(
            framework=str(entry["framework"]),
            id=str(entry["id"]),
            title=str(entry["title"]),
            features=tuple(str(f) for f in entry.get("features") or ()),
            tests=tuple(str(t) for t in entry.get("tests") or ()),
            gap=str(entry["gap"]) if entry.get("gap") else None,
        )
        unknown = [f for f in control.features if f not in features]
        if unknown:
            raise ValueError(f"compliance: {control.id} names unknown features {unknown}")
        controls.append(control)
    return features, controls


def junit_results(path: str | Path) -> dict[str, str]:
    """pytest node id (path::function, parameters folded) → passed | failed | skipped; a
    function whose cases disagree is failed if any failed, skipped only if all were."""
    results: dict[str, list[str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        module = classname.split(".")
        # pytest writes classname "tests.control.test_api" (or "…test_api.TestClass")
        while module and not module[-1].startswith("test_"):
            module.pop()
        if not module:
            continue
        node = "/".join(module) + ".py::" + name.split("[", 1)[0]
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        results.setdefault(node, []).append(outcome)
    folded = {}
    for node, outcomes in results.items():
        if "failed" in outcomes:
            folded[node] = "failed"
        elif all(o == "skipped" for o in outcomes):
            folded[node] = "skipped"
        else:
            folded[node] = "passed"
    return folded


def matrix(controls: list[Control], results: dict[str, str] | None) -> list[dict[str, Any]]:
    """One row per control with each test's result and the control's status: proven (every
    test passed), failing (one failed), not run (a test has no result), gap (no test)."""
    rows = []
    for control in controls:
        tests = {t: (results or {}).get(t, "not run") for t in control.tests}
        if not control.tests:
            status = "gap"
        elif "failed" in tests.values():
            status = "failing"
        elif all(v == "passed" for v in tests.values()):
            status = "proven"
        else:
            status = "not run"
        rows.append(
            {
                "framework": control.framework,
                "control": control.id,
                "title": control.title,
                "features": list(control.features),
                "tests": tests,
                "status": status,
                "gap": control.gap,
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]], source: str) -> str:
    lines = [
        f"# denpex compliance matrix (test results: {source})",
        "",
        "| framework | control | title | denpex features | tests | status |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        tests = "<br>".join(f"`{t.split('::')[-1]}`: {r}" for t, r in row["tests"].items())
        features = ", ".join(row["features"]) or f"none: {row['gap']}"
        lines.append(
            f"| {row['framework']} | {row['control']} | {row['title']} | {features} | "
            f"{tests or '—'} | **{row['status']}** |"
        )
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    lines += ["", ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))]
    return "\n".join(lines) + "\n"
