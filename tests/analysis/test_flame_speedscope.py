"""speedscope export: validates against speedscope's own schema and parses back to the same counts."""

import json
from pathlib import Path

import jsonschema
import pytest

from analysis.flamegraph.folded import format_folded, parse_folded
from analysis.flamegraph.profile import Profile
from analysis.flamegraph.speedscope import to_speedscope
from tests.analysis.hostile_profiles import random_hostile_profile

SCHEMA = Path(__file__).parent / "fixtures" / "speedscope-file-format-schema.json"

FOLDED = (
    "MainThread;serve (server.py:40);forward (model.py:12) 120\n"
    "MainThread;serve (server.py:40);tokenize (tok.py:3) 30\n"
    "MainThread;serve (server.py:40) 7\n"
    "MainThread;<script>alert(1)</script>;x&y\"q' 4\n"
    "swapper;do_idle_[k] 9\n"
)


def _validator() -> jsonschema.Draft7Validator:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def _parse_speedscope(doc: dict) -> Profile:
    """An independent reader: speedscope's sampled profile is root-first frame indices plus weights."""
    names = [f["name"] for f in doc["shared"]["frames"]]
    (prof_doc,) = doc["profiles"]
    assert prof_doc["type"] == "sampled"
    assert len(prof_doc["samples"]) == len(prof_doc["weights"])
    out = Profile()
    for stack, weight in zip(prof_doc["samples"], prof_doc["weights"], strict=True):
        out.add([names[i] for i in stack], weight)
    return out


def test_export_validates_against_speedscopes_schema():
    doc = json.loads(json.dumps(to_speedscope(parse_folded(FOLDED), name="server 1234")))
    _validator().validate(doc)
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"


def test_validator_is_not_vacuous():
    doc = to_speedscope(parse_folded(FOLDED), name="x")
    doc["profiles"][0]["unit"] = "samples"  # not in speedscope's ValueUnit enum
    with pytest.raises(jsonschema.ValidationError):
        _validator().validate(doc)


def test_round_trip_gives_the_same_counts_and_folded_text():
    prof = parse_folded(FOLDED)
    doc = json.loads(json.dumps(to_speedscope(prof, name="t")))
    back = _parse_speedscope(doc)
    assert back.stacks == prof.stacks
    assert format_folded(back) == format_folded(prof)
    assert doc["profiles"][0]["endValue"] == prof.total() == 170


def test_frames_are_shared_once_and_units_map_to_speedscopes_enum():
    prof = Profile({("a", "b"): 1, ("a", "c"): 2}, unit="microseconds")
    doc = to_speedscope(prof, name="off-cpu")
    assert [f["name"] for f in doc["shared"]["frames"]] == ["a", "b", "c"]
    assert doc["profiles"][0]["unit"] == "microseconds"
    assert to_speedscope(Profile({("a",): 1}), name="x")["profiles"][0]["unit"] == "none"


def test_empty_profile_is_still_a_valid_file():
    _validator().validate(to_speedscope(Profile(), name="empty"))



@pytest.mark.parametrize("seed", range(30))
def test_random_hostile_profiles_round_trip_and_validate(seed):
    prof = random_hostile_profile(seed)
    doc = json.loads(json.dumps(to_speedscope(prof, name=f"random {seed}")))
    _validator().validate(doc)
    assert _parse_speedscope(doc).stacks == prof.stacks
