"""Writes the bundle's SBOM: CycloneDX 1.5 JSON listing what the air-gapped bundle holds.

Components: the two denpex binaries and the bundle's scripts (files, with SHA-256), every
Python distribution frozen into the binaries (denpex's runtime dependency closure, read with
importlib.metadata from the interpreter that froze them), CPython itself, the PyInstaller and
staticx bootloaders, and the libbpf shared library shipped inside the onedir build.
The JSON is written by hand (a dozen documented fields) so the build needs no extra package.
usage: python dist_scripts/sbom.py --bundle DIR --version V --python PY --out FILE
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

# Runs inside the freezing interpreter: prints [{name, version, license}] for denpex's runtime
# dependency closure (extras excluded, markers evaluated) plus the freezing tools.
CLOSURE = r"""
import json, sys
from importlib import metadata
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement

def norm(name):
    return name.lower().replace("_", "-").replace(".", "-")

seen, todo, out = set(), ["denpex"], []
while todo:
    name = todo.pop()
    if norm(name) in seen:
        continue
    seen.add(norm(name))
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        continue
    meta = dist.metadata
    lic = meta.get("License-Expression") or meta.get("License") or ""
    if not lic or len(lic) > 80:
        lic = next((c.split(" :: ")[-1] for c in meta.get_all("Classifier") or []
                    if c.startswith("License ::")), "")
    out.append({"name": meta["Name"], "version": dist.version, "license": lic, "role": "frozen"})
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        todo.append(req.name)
for tool in ("pyinstaller", "staticx"):
    try:
        out.append({"name": tool, "version": metadata.version(tool), "license": "",
                    "role": "bootloader"})
    except metadata.PackageNotFoundError:
        pass
print(json.dumps({"python": sys.version.split()[0], "packages": out}))
"""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def python_components(python: str) -> tuple[list[dict], str]:
    proc = subprocess.run(
        [python, "-c", CLOSURE], capture_output=True, text=True, check=False, cwd="/"
    )
    if proc.returncode != 0:
        raise SystemExit(f"sbom.py: cannot list the packages of {python}: {proc.stderr.strip()}")
    data = json.loads(proc.stdout)
    components = []
    for pkg in sorted(data["packages"], key=lambda p: p["name"].lower()):
        name = pkg["name"].lower().replace("_", "-")
        component = {
            "type": "library",
            "bom-ref": f"pkg:pypi/{name}@{pkg['version']}",
            "name": pkg["name"],
            "version": pkg["version"],
            "purl": f"pkg:pypi/{name}@{pkg['version']}",
        }
        if pkg["license"]:
            component["licenses"] = [{"license": {"name": pkg["license"]}}]
        if pkg["role"] == "bootloader":
            component["description"] = "its bootloader is part of the frozen binaries"
        components.append(component)
    return components, data["python"]


def libbpf_components(bundle: Path) -> list[dict]:
    found = []
    for lib in sorted(bundle.rglob("libbpf.so*")):
        match = re.search(r"libbpf\.so\.(\d+(?:\.\d+)*)", lib.name)
        version = match.group(1) if match else "unknown"
        deb = _dpkg_version("libbpf1")  # "1:1.1.2-0+deb12u1": epoch, upstream, revision
        epoch, _, deb_version = deb.rpartition(":")
        version = deb_version.split("-")[0] if deb else version
        found.append(
            {
                "type": "library",
                "bom-ref": f"libbpf@{version}:{lib.relative_to(bundle).as_posix()}",
                "name": "libbpf",
                "version": version,
                "purl": f"pkg:deb/debian/libbpf1@{deb_version}"
                + (f"?epoch={epoch}" if epoch else "")
                if deb
                else f"pkg:generic/libbpf@{version}",
                "licenses": [{"expression": "LGPL-2.1-only OR BSD-2-Clause"}],
                "hashes": [{"alg": "SHA-256", "content": sha256(lib)}],
                "description": f"shipped as {lib.relative_to(bundle).as_posix()}",
            }
        )
    return found


def _dpkg_version(package: str) -> str:
    try:
        proc = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", package],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def file_components(bundle: Path, version: str) -> list[dict]:
    wanted = ["denpex/denpex", "denpex-static", "install.sh"]
    wanted += sorted(
        p.relative_to(bundle).as_posix()
        for folder in ("slurm", "systemd", "k8s", "config")
        for p in (bundle / folder).rglob("*")
        if p.is_file()
    )
    components = []
    for rel in wanted:
        path = bundle / rel
        if not path.is_file():
            continue
        components.append(
            {
                "type": "application" if rel in ("denpex/denpex", "denpex-static") else "file",
                "bom-ref": f"file:{rel}",
                "name": rel,
                "version": version,
                "hashes": [{"alg": "SHA-256", "content": sha256(path)}],
            }
        )
    return components


def build(bundle: Path, version: str, python: str, arch: str) -> dict:
    packages, python_version = python_components(python)
    cpython = {
        "type": "framework",
        "bom-ref": f"cpython@{python_version}",
        "name": "CPython",
        "version": python_version,
        "licenses": [{"license": {"id": "PSF-2.0"}}],
        "description": "the interpreter frozen into both binaries",
    }
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid4()}",
        "version": 1,
        "metadata": {
            "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tools": {
                "components": [
                    {
                        "type": "application",
                        "name": "denpex dist_scripts/sbom.py",
                        "version": version,
                    }
                ]
            },
            "component": {
                "type": "application",
                "bom-ref": f"denpex-airgap-bundle@{version}",
                "name": f"denpex-airgap-bundle-{version}-{arch}",
                "version": version,
                "purl": f"pkg:pypi/denpex@{version}",
                "licenses": [{"license": {"id": "Apache-2.0"}}],
            },
        },
        "components": [
            *file_components(bundle, version),
            cpython,
            *packages,
            *libbpf_components(bundle),
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sbom.py", description=__doc__)
    parser.add_argument("--bundle", type=Path, required=True, help="the bundle folder")
    parser.add_argument("--version", required=True)
    parser.add_argument("--arch", required=True)
    parser.add_argument("--python", default=sys.executable, help="the freezing interpreter")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    bom = build(args.bundle, args.version, args.python, args.arch)
    args.out.write_text(json.dumps(bom, indent=2) + "\n")
    print(f"sbom.py: {args.out.name}: {len(bom['components'])} components")
    return 0


if __name__ == "__main__":
    sys.exit(main())
