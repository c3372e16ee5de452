"""The reference pages state current facts: docs/configs.md and docs/methods.md are what the config classes
and the method registry generate today, and every field has a description."""

from pathlib import Path

import pytest

from fedjax_lab.experiments.reference import config_reference, methods_reference

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize("page, generate", [("configs.md", config_reference),
                                            ("methods.md", methods_reference)])
def test_the_reference_pages_are_current(page, generate):
    assert (DOCS / page).read_text() == generate(), (
        f"docs/{page} is out of date: run `fedjax-lab reference {page[:-3]} > docs/{page}`")


def test_every_config_field_says_what_it_does():
    undescribed = [line.split("|")[1].strip() for line in config_reference().splitlines()
                   if line.startswith("| `") and line.rstrip().endswith("|  |")]
    assert not undescribed, f"fields without a description: {undescribed}"
