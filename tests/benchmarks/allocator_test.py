"""benchmarks/allocator.py: each main job starts with the allocator asked
for, and the summary compares the allocators within each round whatever
order they ran in."""

import json
import os
import sys
import types

import pytest

from testing import load_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Reads a process's environment and arithmetic: the same on every backend.
pytestmark = pytest.mark.once_per_suite


@pytest.fixture(scope="module")
def allocator():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))  # its `_harness`
    return load_module(os.path.join(ROOT, "benchmarks", "allocator.py"), "allocator")


def test_each_job_starts_with_its_allocator_and_reports_what_it_cost(allocator, monkeypatch,
                                                                     tmp_path):
    seen = []

    def run(command, env=None, **kwargs):
        seen.append((env["GLIBC_TUNABLES"], env["KERAS_BACKEND"], command))
        path = command[command.index("--results-json") + 1]
        with open(path, "w") as f:
            json.dump({"train_seconds": 1.5, "seconds": {"training": 1.5,
                                                     "static evaluation": 2.5}}, f)
        return types.SimpleNamespace(returncode=0, stderr="")

    monkeypatch.setattr(allocator.subprocess, "run", run)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    args = types.SimpleNamespace(max_tokens=300, data_dir=None, dynamic=False)
    default = allocator.run_job("jax", "default", args, str(tmp_path))
    huge = allocator.run_job("jax", "huge-pages", args, str(tmp_path))
    assert [s[0] for s in seen] == ["glibc.malloc.arena_max=2",
                                    "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"]
    command = seen[0][2]
    assert command[1].endswith(os.path.join("examples", "ptb_word.py"))
    assert "--no-dynamic" in command and "--no-download" in command
    assert command[command.index("--max-tokens") + 1] == "300"
    assert (default["allocator"], huge["allocator"]) == ("default", "huge-pages")
    assert default["train_s"] == 1.5 and default["scoring_s"] == 2.5
    assert 0 <= default["system_share"] <= 1


def test_the_summary_pairs_each_round_whatever_ran_first(allocator):
    def job(name, wall):
        return {"allocator": name, "wall_s": wall, "user_s": 1.0, "system_s": 0.5,
                "system_share": 1 / 3, "minor_faults": 10, "train_s": 1.0, "scoring_s": 2.0}

    runs = [job("default", 9.0), job("huge-pages", 6.0),   # round 0: default first
            job("huge-pages", 5.0), job("default", 8.0)]   # round 1: swapped
    summary = allocator.summary(runs)
    assert summary["default_over_huge_pages_wall"] == pytest.approx([1.5, 1.6])
    assert summary["default"]["wall_s"] == pytest.approx(8.5)
    assert summary["huge-pages"]["wall_s"] == pytest.approx(5.5)


def test_the_script_writes_every_run_and_its_table(allocator, monkeypatch, tmp_path, capsys):
    walls = iter([9.0, 6.0, 5.0, 8.0])

    def run_job(backend, name, args, folder):
        return {"allocator": name, "wall_s": next(walls), "user_s": 1.0, "system_s": 0.5,
                "system_share": 1 / 3, "minor_faults": 10, "train_s": 1.0, "scoring_s": 2.0}

    monkeypatch.setattr(allocator, "run_job", run_job)
    path = tmp_path / "allocator.json"
    monkeypatch.setattr(sys, "argv", ["allocator.py", "--backends", "jax", "--rounds", "2",
                                      "--on-busy", "ignore", "--json", str(path)])
    assert allocator.main() == 0
    written = json.loads(path.read_text())["backends"]["jax"]
    assert [r["allocator"] for r in written["runs"]] == ["default", "huge-pages",
                                                         "huge-pages", "default"]
    assert written["summary"]["default_over_huge_pages_wall"] == pytest.approx([1.5, 1.6])
    assert "| jax | default | 8.5 |" in capsys.readouterr().out
