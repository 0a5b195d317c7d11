"""Fixtures shared by the whole suite, and the check that denpex is installed at all.

`pytest` from a fresh clone would otherwise fail at collection with "No module named
denpex._native": the compiled modules and the package mapping (`_native/`, `sdk/`,
`signatures/` → `denpex.*`) exist only once the project is installed.
"""

from __future__ import annotations

import importlib.util

_MISSING = [
    name
    for name in ("denpex._native", "denpex.sdk", "denpex.signatures")
    if importlib.util.find_spec(name) is None
]
if _MISSING:
    # SystemExit, not pytest.exit(): pytest reports an exception in a conftest as an
    # ImportError with a traceback, and this is one line a person has to read
    raise SystemExit(
        f"denpex is not installed here ({', '.join(_MISSING)} missing); first run:\n"
        "  pip install -e '.[test]'   (or: bash scripts/test-all.sh, which installs everything)"
    )

import os  # noqa: E402  (after the check above, on purpose)
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from importlib import resources  # noqa: E402

# Retrieval under every verdict loads a 23 MB model in each `denpex run`/`scan` a test starts:
# off for the suite (subprocesses inherit it); tests/retrieval turns it on where it is tested.
os.environ.setdefault("DENPEX_RAG", "off")
# PyTorch makes its compile cache `torchinductor_<user>` in the system's temporary folder as
# soon as Lightning is imported (while the tests are collected): the suite's goes with it.
_TORCH_CACHE = None
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _TORCH_CACHE = os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="denpex-torch-")
# denpex's own cache (the validated catalog, the fake NVML library) lives as long as the suite
_DENPEX_CACHE = None
if "DENPEX_CACHE_DIR" not in os.environ:
    _DENPEX_CACHE = os.environ["DENPEX_CACHE_DIR"] = tempfile.mkdtemp(prefix="denpex-cache-")

import jsonschema  # noqa: E402
import orjson  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _objects_in_a_temporary_folder(tmp_path_factory):
    """`denpex server` keeps report archives and evidence bundles under the state dir by
    default: the suite's servers (in-process, and the subprocesses that inherit the variable)
    keep them in a temporary folder instead, so that a test run leaves nothing behind."""
    if "DENPEX_OBJECTS" in os.environ:
        yield
        return
    os.environ["DENPEX_OBJECTS"] = f"file://{tmp_path_factory.mktemp('objects')}"
    yield
    os.environ.pop("DENPEX_OBJECTS", None)


def _tensorflow_check(where: str) -> None:
    """The suite's process never imports TensorFlow (tests/sdk/children/tensorflow_cases.py
    says why; its child pytest sets DENPEX_TESTS_WITH_TENSORFLOW)."""
    if "tensorflow" in sys.modules and not os.environ.get("DENPEX_TESTS_WITH_TENSORFLOW"):
        pytest.fail(
            f"TensorFlow was imported {where}: it takes OpenSSL's names from every library "
            "loaded after it; import it in a child process (tests/sdk/children/tensorflow_cases.py)",
            pytrace=False,
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    for made in (_TORCH_CACHE, _DENPEX_CACHE):
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    _tensorflow_check("while the tests were collected")


def pytest_runtest_teardown(item: pytest.Item) -> None:
    _tensorflow_check(f"by {item.nodeid}")


@pytest.fixture(scope="session")
def diagnosis_schema() -> dict:
    text = resources.files("denpex.core").joinpath("schemas/diagnosis.v1.json").read_text()
    return orjson.loads(text)


@pytest.fixture(scope="session")
def validate_diagnosis(diagnosis_schema):
    validator = jsonschema.Draft202012Validator(
        diagnosis_schema, format_checker=jsonschema.FormatChecker()
    )

    def validate(data: dict) -> None:
        validator.validate(data)

    return validate


def _select_backend(param: str, monkeypatch: pytest.MonkeyPatch) -> str:
    import denpex._native as native

    if param == "reference":
        monkeypatch.setenv("DENPEX_NO_EXTENSIONS", "1")
    elif native.extensions_disabled():
        pytest.skip("DENPEX_NO_EXTENSIONS=1 is set for the whole run: only the twins are in use")
    else:
        missing = [n for n in native.NATIVE_MODULES if native.backend(n) != "native"]
        if missing:  # tests/native/test_backend.py fails when a built module does not load
            pytest.skip(f"compiled modules not built: {', '.join(missing)}")
    return param


@pytest.fixture(params=["native", "reference"])
def both_backends(request, monkeypatch):
    """Runs a test on the compiled modules and again on their pure-Python twins (ids
    `[native]` / `[reference]`, as aiohttp's c-parser / py-parser), so one pytest run checks
    both; subprocesses inherit the choice through DENPEX_NO_EXTENSIONS. Use it with
    `pytestmark = pytest.mark.usefixtures("both_backends")` in modules whose code reaches a
    native module (the matcher, the line splitter, the ring buffer, the checksums)."""
    return _select_backend(request.param, monkeypatch)


@pytest.fixture(scope="module", params=["native", "reference"])
def module_backend(request):
    """both_backends for module-scoped fixtures that compute once per backend (the corpus
    evaluation): a fixture that depends on it is computed again for each."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield _select_backend(request.param, monkeypatch)
