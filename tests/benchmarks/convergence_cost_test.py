"""benchmarks/convergence_cost.py: its worker times the study's own model and
callbacks, waits for its side-by-side peers, and its floor counts the tied
softmax's three matmuls."""

import argparse
import os
import sys

import keras
import pytest

from testing import load_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "jax", reason="the study it times runs on JAX"
)


@pytest.fixture(scope="module")
def cost():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))  # its sibling modules
    return load_module(os.path.join(ROOT, "benchmarks", "convergence_cost.py"),
                       "convergence_cost")


def _args(**changes):
    values = dict(parameters=20_000, vocabulary=60, batch=4, window=5, steps=3, warmup=2,
                  floor_repeats=2, dynamic_tokens=20)
    values.update(changes)
    return argparse.Namespace(**values)


def test_the_worker_times_the_studys_run_after_its_peers_are_ready(cost, tmp_path):
    args = _args()
    units, params = cost.row_units(args, "mogrifier_rlstm")
    assert abs(params - 20_000) <= 0.03 * 20_000  # the study's budget rule
    result = cost.train_worker(args, "mogrifier_rlstm", units, str(tmp_path), 1)
    assert len(result["steps_s"]) == args.steps  # after the warm-up, each step
    assert result["median_step_s"] > 0
    assert [f for f in os.listdir(tmp_path) if f.endswith(".ready")]  # said it was ready


def test_the_study_rows_units_are_the_recorded_ones(cost):
    args = _args(parameters=cost.study_parameters(), vocabulary=10_000)
    assert cost.row_units(args, "lstm") == (200, 2_651_600)  # the study's JSON


def test_the_floor_counts_the_softmaxs_three_matmuls(cost):
    args = _args()
    floor = cost.softmax_floor_worker(args, 7)
    assert floor["flops"] == 3 * 2 * (4 * 5) * 7 * 60
    assert len(floor["all_s"]) == 2 and floor["median_s"] > 0


def test_the_dynamic_pass_is_timed_per_token(cost):
    args = _args()
    units, _ = cost.row_units(args, "lstm")
    assert cost.dynamic_worker(args, "lstm", units)["median_ms_per_token"] > 0


def test_pinned_workers_get_a_core_each_and_shared_ones_none(cost, monkeypatch):
    given = []

    def run_in_backend(function, *args, env=None, **kwargs):
        given.append(env[cost._harness.CORES_VARIABLE])
        return {"median_step_s": 1.0}

    monkeypatch.setattr(cost._harness, "run_in_backend", run_in_backend)
    cores = sorted(os.sched_getaffinity(0))
    cost.run_side_by_side(_args(), "lstm", 8, len(cores), pinned=True)
    assert sorted(given) == [str(c) for c in cores]
    given.clear()
    cost.run_side_by_side(_args(), "lstm", 8, 2)
    assert given == ["", ""]  # an inherited variable pins nothing
    with pytest.raises(ValueError, match="a core each"):
        cost.run_side_by_side(_args(), "lstm", 8, len(cores) + 1, pinned=True)


def test_workers_start_with_the_allocator_asked_for(cost, monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    huge = cost.worker_environment("huge-pages", "1")
    assert huge["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert huge[cost._harness.CORES_VARIABLE] == "1"
    assert huge["XLA_FLAGS"] == cost._harness.XLA_ONE_THREAD_FLAGS
    assert cost.worker_environment("default")["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"
    with pytest.raises(ValueError, match="'jemalloc'"):
        cost.worker_environment("jemalloc")


def test_the_allocator_rounds_alternate_pinned_pairs_and_compare_per_round(cost, monkeypatch):
    given = []
    steps = iter([0.9, 0.9, 0.6, 0.6, 1.0, 0.8, 0.5, 0.5])

    def run_in_backend(function, *args, env=None, **kwargs):
        given.append((env["GLIBC_TUNABLES"], env[cost._harness.CORES_VARIABLE]))
        return {"median_step_s": next(steps)}

    monkeypatch.setattr(cost._harness, "run_in_backend", run_in_backend)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setattr(cost._harness, "own_cores", lambda: [0, 1])
    rounds = cost.allocator_rounds(_args(), "lstm", 8, 2)
    assert [r["allocator"] for r in rounds] == ["default", "huge-pages"] * 2
    assert sorted(given[:2]) == [("", "0"), ("", "1")]  # a core each
    assert sorted(given[2:4]) == [("glibc.malloc.hugetlb=1", "0"),
                                  ("glibc.malloc.hugetlb=1", "1")]
    summary = cost.allocator_summary(rounds)
    assert summary["default_over_huge_pages"] == pytest.approx([0.9 / 0.6, 0.9 / 0.5])
    assert summary["median_step_s"] == {"default": pytest.approx(0.9),
                                        "huge-pages": pytest.approx(0.55)}
