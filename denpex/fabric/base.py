"""The fabric collectors' base: the collector contract of `denpex.core.collector`, with
default settings and thresholds read from `denpex/fabric/settings.yaml`."""

from __future__ import annotations

from denpex.core.collector import Collector


class FabricCollector(Collector):
    settings_file = "denpex.fabric:settings.yaml"
