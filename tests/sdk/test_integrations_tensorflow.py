"""The Keras callback and the tf.distribute helper on CPU: places from TF_CONFIG and from a
strategy, real `model.fit` runs (healthy, a NaN loss, a stalled loop): children/
tensorflow_cases.py, in a child pytest, since this process never imports TensorFlow; and,
slow, two MultiWorkerMirroredStrategy workers on loopback exchanging heartbeats through
TensorFlow's coordination service."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.control.pg import free_port

CHILD = Path(__file__).parent / "children" / "integ_tf_multiworker.py"
# the tests that import TensorFlow, run in a child pytest (that file says why)
CASES = Path(__file__).parent / "children" / "tensorflow_cases.py"
CASE_NAMES = [
    node.name
    for node in ast.parse(CASES.read_text()).body
    if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
]
needs_tensorflow = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None,
    reason="needs TensorFlow: pip install tensorflow-cpu",
)


@pytest.fixture(scope="module")
def tensorflow_results(tmp_path_factory) -> dict[str, str | None]:
    """Each case's failure text (None: it passed), from one child pytest over CASES."""
    report = tmp_path_factory.mktemp("tensorflow") / "junit.xml"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--timeout",
            "300",
            f"--junitxml={report}",
            str(CASES),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(
            os.environ,
            CUDA_VISIBLE_DEVICES="",
            TF_CPP_MIN_LOG_LEVEL="2",
            DENPEX_TESTS_WITH_TENSORFLOW="1",
        ),
    )
    if not report.exists():
        pytest.fail(f"the TensorFlow cases did not run ({run.returncode}): {run.stdout[-3000:]}")
    results: dict[str, str | None] = {}
    for case in ET.parse(report).iter("testcase"):
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        results[case.get("name", "")] = None if problem is None else problem.text or "failed"
    return results


@needs_tensorflow
@pytest.mark.parametrize("case", CASE_NAMES)
def test_with_tensorflow(case: str, tensorflow_results: dict[str, str | None]) -> None:
    assert case in tensorflow_results, f"{case} did not run in the child pytest"
    assert tensorflow_results[case] is None, tensorflow_results[case]


@pytest.mark.slow
def test_two_multiworker_workers_see_each_other_through_the_coordination_service() -> None:
    ports = [str(free_port()), str(free_port())]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    workers = [
        subprocess.Popen(
            [sys.executable, str(CHILD), str(i), *ports],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    results = []
    try:
        for worker in workers:
            out, err = worker.communicate(timeout=240)
            assert worker.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    for index, result in enumerate(results):
        peer = str(1 - index)
        assert (result["rank"], result["world"]) == (index, 2)
        assert result["step"] == 32 and result["store"] == "StoreLink"  # 256 / 8 batches
        seen, step = result["peers"][peer]
        assert seen and step > 0
        assert result["evidence"] == []


def test_denpex_run_and_the_sdk_never_import_tensorflow() -> None:
    env = dict(os.environ, DENPEX_SERVER_URL="", PYTHONPROFILEIMPORTTIME="1")  # both processes
    run = subprocess.run(
        [sys.executable, "-m", "denpex", "run", "--", sys.executable, "-c", "import denpex.sdk"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if "|" in line}
    assert {"denpex.lite.session", "denpex.sdk.watch"} <= imported  # the run and its job
    assert not {m for m in imported if m.split(".")[0] in ("tensorflow", "keras")}
