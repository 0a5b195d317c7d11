"""The one rule that turns a metric event's name into the names denpex exports, used by the
Prometheus page (/metrics) and the OTLP encoder alike, so a series has one name wherever it
is read; and the HELP text (OTLP description) of each.

Pure; never renames what dashboards already know: dcgm-exporter's `DCGM_*` names stay as
they are, counters included (dcgm-exporter exports `# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER
counter` and a series of that very name, never a `_total` one), and a name that already
carries the `denpex_` prefix is not prefixed twice.
"""

from __future__ import annotations

from collections.abc import Mapping

PREFIX = "denpex_"
VERBATIM_PREFIXES = ("DCGM_",)  # dcgm-exporter's names, kept so GPU dashboards match
COUNTER_SUFFIX = "_total"


def verbatim(name: str) -> bool:
    """A name another exporter defined (dcgm-exporter's): exported exactly as it is."""
    return name.startswith(VERBATIM_PREFIXES)


def family_name(name: str, *, counter: bool) -> str:
    """The metric family (`# HELP`/`# TYPE` line): `denpex_` + the event's name, without a
    counter's `_total` (OpenMetrics names a counter family without it)."""
    if verbatim(name):
        return name
    base = name.removesuffix(COUNTER_SUFFIX) if counter else name
    return base if base.startswith(PREFIX) else PREFIX + base


def series_name(name: str, *, counter: bool) -> str:
    """The name of the series: the family, and `_total` after a counter's (never after a
    verbatim name's). It is what a scrape of /metrics shows and what an OTLP metric is
    called."""
    family = family_name(name, counter=counter)
    return family + COUNTER_SUFFIX if counter and not verbatim(name) else family


def help_text(name: str, source: str, helps: Mapping[str, str]) -> str:
    """The collector's HELP text for the event name `name`, or a plain fallback."""
    return helps.get(name) or f"{name} as reported by the {source} collector"
