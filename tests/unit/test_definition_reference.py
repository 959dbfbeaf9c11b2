"""docs/definitions.md is the definition models' reference, field for field."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsm_celery.core.loader import read_yaml
from fsm_celery.definition_reference import MEANINGS, SECTIONS, definition_reference

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "definitions.md"
FIELDS = {
    f"{model.__name__}.{name}": (info.alias or name)
    for _, model, _ in SECTIONS
    for name, info in model.model_fields.items()
}


def test_the_reference_is_the_models_as_generated() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == definition_reference(), (
        "docs/definitions.md differs from the models: run `make docs`"
    )


def test_every_field_of_every_model_has_a_meaning_and_no_meaning_is_stale() -> None:
    assert sorted(FIELDS.keys() - MEANINGS.keys()) == [], "fields without a meaning"
    assert sorted(MEANINGS.keys() - FIELDS.keys()) == [], "meanings of no field"


@pytest.mark.parametrize("field", sorted(MEANINGS))
def test_each_example_is_yaml_setting_its_own_field(field: str) -> None:
    example = MEANINGS[field][1]
    assert list(read_yaml(example, field)) == [FIELDS[field]]
