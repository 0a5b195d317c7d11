"""The shared vocabulary of every denpex layer: Event, Evidence, Diagnosis, the taxonomy, JSON.

Pure data and pure functions: nothing here touches the network, and nothing here imports a
higher layer.
"""

from denpex.core.diagnosis import (
    ACTIONS,
    SCHEMA_ID,
    Action,
    Contributing,
    Diagnosis,
    RootCause,
    TimelineEntry,
)
from denpex.core.events import SEVERITIES, SOURCES, Event, Evidence, severity_rank
from denpex.core.taxonomy import Category, Taxonomy, load_taxonomy

__all__ = [
    "ACTIONS",
    "SCHEMA_ID",
    "SEVERITIES",
    "SOURCES",
    "Action",
    "Category",
    "Contributing",
    "Diagnosis",
    "Event",
    "Evidence",
    "RootCause",
    "Taxonomy",
    "TimelineEntry",
    "load_taxonomy",
    "severity_rank",
]
