"""dcgm-exporter compatibility, shared by the NVML and DCGM collectors: the DCGM_* metric
names denpex exports with their DCGM field ids, Prometheus types and HELP texts (data:
`dcgm_fields.yaml`), and the label set dcgm-exporter's renderer writes on a GPU's metrics.

Pure data access; never calls a GPU library and never invents a field the file lacks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml

TYPES = ("gauge", "counter", "label", "identity")
DRIVER_LABEL = "DCGM_FI_DRIVER_VERSION"  # dcgm-exporter names a label field's label so


@dataclass(frozen=True, slots=True)
class DcgmField:
    name: str
    id: int
    type: str  # gauge | counter | label | identity
    help: str
    not_exported: str = ""

    @property
    def counter(self) -> bool:
        return self.type == "counter"


@cache
def dcgm_fields() -> Mapping[str, DcgmField]:
    """Every field of dcgm_fields.yaml by name; ValueError names a malformed entry."""
    text = resources.files("denpex.gpu").joinpath("dcgm_fields.yaml").read_text()
    found: dict[str, DcgmField] = {}
    for name, entry in (yaml.safe_load(text) or {}).items():
        if not isinstance(entry, Mapping) or entry.get("type") not in TYPES:
            raise ValueError(f"dcgm_fields.yaml: {name}: needs id, type ({'|'.join(TYPES)}), help")
        found[name] = DcgmField(
            name, int(entry["id"]), entry["type"], str(entry["help"]), entry.get("not_exported", "")
        )
    return found


def field_id(name: str) -> int:
    return dcgm_fields()[name].id


def is_counter(name: str) -> bool:
    entry = dcgm_fields().get(name)
    return entry is not None and entry.counter


def help_texts() -> dict[str, str]:
    """HELP text of every exported DCGM_* metric."""
    return {f.name: f.help for f in dcgm_fields().values() if f.type in ("gauge", "counter")}


def exporter_labels(
    gpu: int,
    identity: Mapping[str, str],
    host: str,
    *,
    profile: str = "",
    instance: int | None = None,
) -> dict[str, str]:
    """dcgm-exporter's labels of one GPU's metric (or, with `profile` and `instance`, one of
    its MIG devices'): `device` is nvidia<gpu id>, the driver version is a label."""
    labels = {
        "gpu": str(gpu),
        "UUID": identity.get("uuid", ""),
        "pci_bus_id": identity.get("pci_bus_id", ""),
        "device": f"nvidia{gpu}",
        "modelName": identity.get("name", ""),
    }
    if profile or instance is not None:
        labels["GPU_I_PROFILE"] = profile
        labels["GPU_I_ID"] = "" if instance is None else str(instance)
    labels["Hostname"] = host
    labels[DRIVER_LABEL] = identity.get("driver_version", "")
    return labels
