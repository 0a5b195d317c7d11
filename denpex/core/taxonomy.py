"""The failure-category contract (taxonomy.yaml, shipped as package data).

Every signature names one category from it and every diagnosis reports one as its root cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml


@dataclass(frozen=True, slots=True)
class Category:
    id: str
    layer: int
    title: str


class Taxonomy:
    """The categories by id, in the order the contract lists them."""

    def __init__(self, categories: list[Category]) -> None:
        self.categories = {c.id: c for c in categories}

    def __contains__(self, category_id: object) -> bool:
        return category_id in self.categories

    def __getitem__(self, category_id: str) -> Category:
        return self.categories[category_id]

    def __iter__(self):
        return iter(self.categories.values())

    def __len__(self) -> int:
        return len(self.categories)

    def layer(self, category_id: str) -> int:
        category = self.categories.get(category_id)
        return category.layer if category else 0


def parse_taxonomy(text: str) -> Taxonomy:
    data = yaml.safe_load(text)
    return Taxonomy(
        [Category(str(c["id"]), int(c["layer"]), str(c["title"])) for c in data["categories"]]
    )


@cache
def load_taxonomy() -> Taxonomy:
    """The taxonomy shipped with this version of denpex."""
    text = resources.files("denpex.core").joinpath("taxonomy.yaml").read_text("utf-8")
    return parse_taxonomy(text)
