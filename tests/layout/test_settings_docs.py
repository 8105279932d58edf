"""docs/settings.md is the settings model's own page: a setting added without regenerating it fails here."""

from __future__ import annotations

from cli.settings_docs import PAGE, settings_markdown
from gateway.settings import Settings


def test_the_settings_page_is_current() -> None:
    assert PAGE.read_text() == settings_markdown(), "run: python -m cli.settings_docs"


def test_every_setting_has_its_row() -> None:
    page = PAGE.read_text()
    for name, field in Settings.model_fields.items():
        group = getattr(field.annotation, "model_fields", None)
        if group is None:
            assert f"`MODGATE_{name.upper()}`" in page
        else:
            assert all(f"`MODGATE_{name.upper()}__{inner.upper()}`" in page for inner in group)
