"""The signature catalog: YAML schema, validating loader, and the matcher facade (DESIGN §5)."""

from denpex.catalog.catalog import Catalog, Match, load_catalog
from denpex.catalog.loader import CatalogError, load_signatures
from denpex.catalog.schema import Signature

__all__ = ["Catalog", "CatalogError", "Match", "Signature", "load_catalog", "load_signatures"]
