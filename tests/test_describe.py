"""The settings reference is generated from the declarations, lists every method, and is kept in docs/."""
import json
from pathlib import Path

from gcl.data.benchmarks import KINDS
from gcl.describe import main, reference
from gcl.methods import METHODS

DOCS = Path(__file__).resolve().parents[1] / "docs" / "settings.md"


def test_docs_settings_is_the_generated_reference():
    assert DOCS.read_text() == reference(), "docs/settings.md is stale: run `python -m gcl.describe > docs/settings.md`"


def test_every_method_and_kind_is_listed_with_its_settings_and_defaults():
    text = reference()
    for name, cls in METHODS.items():
        section = text.split(f"### {name}\n", 1)[1].split("### ", 1)[0]
        for setting in cls.Settings.model_fields:
            assert f"| {setting} " in section, (name, setting)
    for name in KINDS:
        assert f"### {name}\n" in text
    coca = reference("coca")
    assert "| omega" in coca and "float >= 0 and <= 1" in coca and "| 0.1 " in coca
    assert "| lr " in coca and "required" in coca


def test_schema_is_json_for_editors(capsys):
    main(["--schema"])
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "params.yaml" and "runs" in schema["properties"]
    assert schema["additionalProperties"] is False
