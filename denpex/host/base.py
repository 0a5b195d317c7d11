"""The host collectors' base: the collector contract of `denpex.core.collector`, with default
settings and detector thresholds read from `denpex/host/thresholds.yaml`."""

from __future__ import annotations

from denpex.core.collector import Collector


class HostCollector(Collector):
    settings_file = "denpex.host:thresholds.yaml"
