"""The shared vocabulary: taxonomy as package data, the JSON schema agrees with it."""

from __future__ import annotations

from importlib import resources

import jsonschema
import pytest
import yaml

from denpex.core import ACTIONS, SCHEMA_ID, Diagnosis, jsonio, load_taxonomy
from denpex.core.events import format_ts
from denpex.core.taxonomy import parse_taxonomy


def schema() -> dict:
    text = resources.files("denpex.core").joinpath("schemas/diagnosis.v1.json").read_text()
    return jsonio.loads(text)


def test_taxonomy_ships_with_the_package():
    taxonomy = load_taxonomy()
    assert "gpu.fallen_off_bus" in taxonomy and "unknown" in taxonomy
    assert taxonomy.layer("gpu.fallen_off_bus") == 2
    assert len(taxonomy) >= 50


def test_schema_categories_are_exactly_the_taxonomy():
    enum = schema()["$defs"]["category"]["enum"]
    assert enum == [c.id for c in load_taxonomy()]


def test_schema_actions_are_the_remediation_vocabulary():
    assert tuple(schema()["$defs"]["action"]["enum"]) == ACTIONS


def test_empty_diagnosis_is_valid_json_of_the_contract():
    data = jsonio.loads(jsonio.dumps(Diagnosis().to_dict()))
    jsonschema.validate(data, schema())
    assert data["schema"] == SCHEMA_ID
    assert data["root_cause"]["category"] == "unknown"


def test_schema_rejects_a_category_outside_the_taxonomy():
    data = Diagnosis().to_dict()
    data["root_cause"]["category"] = "gpu.made_up"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema())


def test_parse_taxonomy_reads_layers():
    text = yaml.safe_dump({"version": 1, "categories": [{"id": "a.b", "layer": 3, "title": "t"}]})
    assert parse_taxonomy(text)["a.b"].layer == 3


def test_format_ts_is_utc_millis():
    assert format_ts(1796014569123456789) == "2026-11-30T04:56:09.123Z"
    assert format_ts(None) is None
