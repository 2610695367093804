"""scripts/mutation_check.py stays usable: every mutant still applies to
today's package (its snippet occurs exactly once, the mutated file compiles
and differs), and `--compare` fails when a mutant the old suite killed
survives the new one. The mutants themselves are run by hand
(docs/testing.md): hours of CPU."""

import json
import os

import pytest

from testing import load_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Reads the package's source as text: the same on every backend.
pytestmark = pytest.mark.once_per_suite


@pytest.fixture(scope="module")
def mutation_check():
    return load_module(os.path.join(ROOT, "scripts", "mutation_check.py"), "mutation_check")


def test_every_mutant_applies_to_the_package_as_it_is(mutation_check):
    from pathlib import Path

    assert len(mutation_check.MUTANTS) >= 40
    assert len({m.id for m in mutation_check.MUTANTS}) == len(mutation_check.MUTANTS)
    problems = {
        m.id: mutation_check.check_mutant(m, Path(ROOT)) for m in mutation_check.MUTANTS
    }
    assert {k: v for k, v in problems.items() if v} == {}


def _results(tmp_path, name, outcomes):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({
        "library": {"commit": "abc", "dirty": False, "package_sha256": "d"},
        "tests": {"source": "commit", "commit": name, "dirty": False},
        "backend": "torch",
        "mutants": {
            i: {"file": "keras_mogrifier/layers/mogrifier.py", "outcome": o, "tests": []}
            for i, o in outcomes.items()
        },
    }))
    return str(path)


def test_compare_fails_when_a_killed_mutant_survives(mutation_check, tmp_path, capsys):
    ids = [m.id for m in mutation_check.MUTANTS[:2]]
    old = _results(tmp_path, "old", {ids[0]: "killed", ids[1]: "survived"})
    same = _results(tmp_path, "same", {ids[0]: "killed", ids[1]: "killed"})
    worse = _results(tmp_path, "worse", {ids[0]: "survived", ids[1]: "killed"})
    assert mutation_check.main(["--compare", old, same]) == 0
    assert mutation_check.main(["--compare", old, worse]) == 1
    assert f"FAIL: {ids[0]}" in capsys.readouterr().out
