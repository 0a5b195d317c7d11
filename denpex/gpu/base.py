"""The GPU collectors' base: the collector contract of `denpex.core.collector`, with default
settings and thresholds read from `denpex/gpu/settings.yaml`."""

from __future__ import annotations

from denpex.core.collector import Collector


class GpuCollector(Collector):
    settings_file = "denpex.gpu:settings.yaml"
