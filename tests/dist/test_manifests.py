"""The bundle's deployment files for the control plane, checked by the tools that read them:
the Kubernetes manifests (a Kustomize base) against the API's own OpenAPI schemas
(kubernetes-validate, strict: an unknown field fails), rendered by `kubectl kustomize` where
kubectl exists; the systemd unit by `systemd-analyze verify` and its hardening by
`systemd-analyze security --offline`."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="pip install kubernetes-validate (the test extra has it)"
)

BUNDLE = Path(__file__).resolve().parents[2] / "dist_scripts" / "bundle"
BASE = BUNDLE / "k8s" / "control-plane"
UNIT = BUNDLE / "systemd" / "denpex-server.service"
MAX_EXPOSURE = 2.0  # systemd-analyze security: 0 (locked down) … 10 (unprotected)


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def base_resources() -> list[dict]:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    return [d for name in kustomization["resources"] for d in documents(BASE / name)]


def rendered() -> list[dict]:
    """`kubectl kustomize` of the base (namespace and labels applied), else the raw files."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return base_resources()
    out = subprocess.run(
        [kubectl, "kustomize", str(BASE)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.mark.parametrize(
    "path",
    [
        *sorted(set(BASE.glob("*.yaml")) - {BASE / "kustomization.yaml"}),
        BUNDLE / "k8s" / "daemonset.yaml",
    ],
    ids=lambda p: p.name,
)
def test_every_manifest_passes_the_kubernetes_schema_strictly(path):
    version = kubernetes_validate.latest_version()
    for document in documents(path):
        kubernetes_validate.validate(document, version, strict=True)


def test_a_field_the_schema_does_not_know_is_refused():
    """The check can fail: a misspelt field in the Deployment is caught."""
    deployment = next(d for d in base_resources() if d["kind"] == "Deployment")
    deployment["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)


def test_the_rendered_base_is_a_replicated_control_plane_on_a_secret_database():
    objects = {d["kind"]: d for d in rendered()}
    for document in objects.values():
        kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)
    assert set(objects) >= {"Deployment", "Service", "PodDisruptionBudget"}
    deployment, service, pdb = (
        objects["Deployment"],
        objects["Service"],
        objects["PodDisruptionBudget"],
    )
    assert deployment["spec"]["replicas"] >= 2
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for selector in (service["spec"]["selector"], pdb["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= pod_labels.items()
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["DENPEX_SERVER_DB"]["valueFrom"]["secretKeyRef"]["key"] == "db-url"
    assert "value" not in env["DENPEX_SERVER_DB"]  # never a URL (with a password) in the file
    assert container["command"][1] == "server"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def _filled_unit(tmp_path: Path) -> Path:
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    exe = prefix / "bin" / "denpex"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    text = UNIT.read_text()
    for marker, value in (
        ("@PREFIX@", str(prefix)),
        ("@LISTEN@", "127.0.0.1:9479"),
    ):
        text = text.replace(marker, value)
    assert not re.search(r"@[A-Z]+@", text), "a marker install.sh does not fill"
    (prefix / "etc").mkdir()
    (prefix / "etc" / "server.env").write_text("DENPEX_SERVER_DB=sqlite:////var/lib/x.db\n")
    unit = tmp_path / UNIT.name
    unit.write_text(text)
    return unit


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="no systemd-analyze here")
def test_the_server_unit_verifies_and_is_locked_down(tmp_path):
    unit = _filled_unit(tmp_path)
    verify = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verify.returncode == 0, verify.stderr
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", security.stdout)
    assert found, security.stdout + security.stderr
    assert float(found.group(1)) <= MAX_EXPOSURE, security.stdout
