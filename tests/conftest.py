"""Fixtures shared by the whole suite."""

from __future__ import annotations

from importlib import resources

import jsonschema
import orjson
import pytest


@pytest.fixture(scope="session")
def diagnosis_schema() -> dict:
    text = resources.files("denpex.core").joinpath("schemas/diagnosis.v1.json").read_text()
    return orjson.loads(text)


@pytest.fixture(scope="session")
def validate_diagnosis(diagnosis_schema):
    validator = jsonschema.Draft202012Validator(
        diagnosis_schema, format_checker=jsonschema.FormatChecker()
    )

    def validate(data: dict) -> None:
        validator.validate(data)

    return validate
