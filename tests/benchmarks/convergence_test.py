"""benchmarks/convergence.py: the same candidates for every row, successive
halving, the plateau, seeds, a JSON written epoch by epoch, and a stopped
row resumed to the same numbers as one run through."""

import json
import math
import os
import shutil
import types

import keras
import numpy as np
import pytest

from testing import load_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A tiny row on the embedded corpus: 4 candidates, cuts after epochs 1 and 2,
# the final ranking at 3 epochs, seeds 1 and 2 to at most 4.
SETTINGS = [
    "--row", "lstm", "--parameters", "20000", "--candidates", "4", "--rungs", "1", "2",
    "--max-epochs", "3", "--seed-max-epochs", "4", "--seeds", "1", "2", "--max-tokens", "1200",
    "--batch-size", "4", "--bptt", "10", "--checkpoint-every", "7",
    "--dynamic-learning-rates", "1e-4", "1e-3", "--dynamic-decay-rates", "1e-3", "1e-2",
    "--dynamic-slice-tokens", "100", "--dynamic-statistics-batches", "2",
    "--dynamic-statistics-batch", "4", "--dynamic-block", "20",
]
# The script is a study run on JAX (its default); the library pieces it
# drives (TrainingCheckpoint, the averaging and recovery callbacks, the
# carried streams) are tested on every backend in their own files.
pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "jax", reason="the study's script runs on JAX"
)


def _load():
    return load_module(os.path.join(ROOT, "benchmarks", "convergence.py"), "convergence")


@pytest.fixture(scope="module")
def convergence():
    return _load()


def _run(convergence, tmp, *extra):
    paths = ["--output", str(tmp / "out"), "--work-dir", str(tmp / "work")]
    convergence.main(SETTINGS + paths + list(extra))
    return convergence.load_row(str(tmp / "out" / "lstm.json"))


@pytest.fixture(scope="module")
def stopped_and_resumed(convergence, tmp_path_factory):
    """The row stopped after 2 epochs in all (two candidates' first), then
    resumed to its end with two worker processes at a time."""
    tmp = tmp_path_factory.mktemp("row")
    stopped = _run(convergence, tmp, "--stop-after-units", "2")
    return stopped, _run(convergence, tmp, "--resume", "--jobs", "2"), tmp


@pytest.fixture(scope="module")
def row(stopped_and_resumed):
    return stopped_and_resumed[1]


def test_a_cut_has_workers_beyond_the_cores_only_when_every_run_has_one(
        convergence, monkeypatch):
    count = convergence.worker_count
    assert count(3, 8, 2) == 2  # eight candidates: one pinned worker a core
    assert count(3, 3, 2) == 3  # three seeds: a worker each from the start
    assert count(3, 2, 2) == 2 and count(3, 1, 2) == 1  # no more than the runs
    assert count(8, 8, 16) == 8  # a larger machine: as asked
    assert count(3, 8, 0) == 3  # a platform that cannot pin: as asked

    # And a cut follows it: eight runs, --jobs 3, two cores.
    class Record:
        def run(self, name):
            return {"epochs": []}

        def save(self):
            pass

        def reload_runs(self):
            pass

    running, most = [], []

    class Worker:
        def __init__(self, command, env):
            self.polls, self.returncode = 0, None
            running.append(self)
            most.append(len(running))

        def poll(self):
            self.polls += 1
            if self.polls < 2:
                return None
            if self in running:
                running.remove(self)
            self.returncode = 0
            return 0

    monkeypatch.setattr(convergence.subprocess, "Popen", Worker)
    monkeypatch.setattr(convergence.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(convergence._harness, "own_cores", lambda: [0, 1])
    monkeypatch.setattr(convergence, "worker_argv", lambda args: [])
    args = types.SimpleNamespace(jobs=3)
    units = [(f"candidate{i}", {}, 1, 6) for i in range(1, 9)]
    assert convergence.train_all(Record(), units, {"name": "lstm"}, None, args)
    assert max(most) == 2 and len(most) == 8
    most.clear()
    assert convergence.train_all(Record(), units[:3], {"name": "lstm"}, None, args)
    assert max(most) == 3


def test_checkpoints_live_outside_the_checkout_and_their_path_resolves_anywhere(
        convergence, monkeypatch, tmp_path):
    """The work folder is the user's cache, not the checkout (a checkout
    cloned again on the same machine resumes the runs), and a run's weights
    path is written so that it names the file on the machine that reads it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert convergence.default_work_dir() == str(tmp_path / "xdg" / "keras-mogrifier" / "convergence")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    work = convergence.default_work_dir()
    assert work == str(tmp_path / "home" / ".cache" / "keras-mogrifier" / "convergence")
    assert os.path.commonpath([work, ROOT]) != ROOT
    stored = convergence.stored_path(os.path.join(work, "lstm", "seed2", "best.weights.npz"))
    assert stored == os.path.join(
        "~", ".cache", "keras-mogrifier", "convergence", "lstm", "seed2", "best.weights.npz")
    monkeypatch.setenv("HOME", str(tmp_path / "other"))
    assert convergence.recorded_path(stored) == str(
        tmp_path / "other" / ".cache" / "keras-mogrifier" / "convergence" / "lstm" / "seed2"
        / "best.weights.npz")
    # Inside the checkout (the runs recorded before): relative to it, as they are.
    inside = os.path.join(ROOT, "runs", "convergence", "lstm", "seed2", "best.weights.npz")
    assert convergence.stored_path(inside) == os.path.join(
        "runs", "convergence", "lstm", "seed2", "best.weights.npz")
    assert convergence.recorded_path(convergence.stored_path(inside)) == inside
    elsewhere = str(tmp_path / "work" / "best.weights.npz")
    assert convergence.recorded_path(convergence.stored_path(elsewhere)) == elsewhere


def test_latin_hypercube_uses_every_stratum_once(convergence):
    ranges = {"a": (0.0, 1.0), "lr": (1e-4, 1e-2)}
    draws = convergence.latin_hypercube(ranges, 8, seed=3, log_scale=("lr",))
    a = sorted(int(d["a"] * 8) for d in draws)
    lr = sorted(int((math.log(d["lr"]) - math.log(1e-4)) / math.log(100) * 8) for d in draws)
    assert a == list(range(8)) and lr == list(range(8))
    assert draws == convergence.latin_hypercube(ranges, 8, seed=3, log_scale=("lr",))


def test_halving_keeps_the_better_half_and_the_winner_has_every_seed(row):
    assert row["complete"] and row["data_hash"] == "synthetic"
    assert abs(row["params"] - 20000) <= 0.03 * 20000
    runs = row["runs"]
    first, second = row["rungs"]
    assert first["epochs"] == 1 and sorted(first["ranked"]) == sorted(
        f"candidate{i}" for i in range(1, 5)
    )

    def best(name, epochs):
        return min(e["valid_perplexity"] for e in runs[name]["epochs"][:epochs])

    assert [best(n, 1) for n in first["ranked"]] == sorted(best(n, 1) for n in first["ranked"])
    # Each cut records the values it was made on.
    assert first["best_valid_perplexity"] == {n: best(n, 1) for n in first["ranked"]}
    assert row["final_best_valid_perplexity"] == {
        n: best(n, 3) for n in row["final_ranking"]}
    assert first["kept"] == first["ranked"][:2] and second["ranked"] == sorted(
        first["kept"], key=lambda n: best(n, 2)
    )
    assert second["kept"] == second["ranked"][:1] == [row["winner"]]
    # The dropped candidates stopped at their cut; the winner, ranked at 3
    # epochs, went on with the other seed to the seeds' cap of 4 (or their
    # plateau), each saying which ended it.
    for name in first["ranked"][2:]:
        assert len(runs[name]["epochs"]) == 1
        assert not runs[name]["stopped_at_max_epochs"]
    for name in (row["winner"], "seed2"):
        run = runs[name]
        assert run["epoch_cap"] == 4
        assert len(run["epochs"]) == 4 or run["converged"]
        assert run["stopped_at_max_epochs"] == (not run["converged"])
    assert row["seeds"] == {"1": row["winner"], "2": "seed2"}
    assert runs["seed2"]["hyperparameters"] == runs[row["winner"]]["hyperparameters"]
    for name in row["seeds"].values():
        static = runs[name]["static"]
        assert math.isfinite(static["test_perplexity"]) and static["temperature"] > 0
    # The kept weights are the best epoch's: its validation again.
    assert row["summary"]["valid_perplexity"]["values"] == [
        runs[n]["static"]["valid_perplexity"] for n in row["seeds"].values()
    ]
    for name in row["seeds"].values():
        dynamic = runs[name]["dynamic"]
        assert math.isfinite(dynamic["test_perplexity"]) and dynamic["slice_tokens"] >= 100
        assert len(dynamic["passes"]) >= 4  # the whole 2 × 2 grid at least
    assert len(row["summary"]["dynamic_test_perplexity"]["values"]) == 2
    # The best seed on validation, saved with float16 weights, loads.
    model = row["model"]
    valid = {n: runs[n]["static"]["valid_perplexity"] for n in row["seeds"].values()}
    assert model["run"] == min(valid, key=valid.get)
    loaded = keras.saving.load_model(os.path.join(ROOT, model["path"]))
    with np.load(os.path.join(ROOT, runs[model["run"]]["kept_weights"])) as kept:
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(loaded.weights[0]), kept["w0"].astype("float32"))
    # Every seed's best weights are kept in float16 beside the results.
    for name in row["seeds"].values():
        kept = os.path.join(ROOT, runs[name]["kept_weights"])
        assert kept.endswith(f"{name}.float16.npz") and os.path.exists(kept)
        with np.load(kept) as data:
            assert data["w0"].dtype == np.float16
    # The same candidates for every row: the draw depends on the seed only.
    assert row["candidates"][0] == runs["candidate1"]["hyperparameters"]
    # Every epoch says what Two-Tailed Averaging validated; every run where
    # it ran.
    for run in runs.values():
        for epoch in run["epochs"]:
            assert epoch["tta_weights_validated"] in ("raw", "long")
            assert epoch["tta_long_length"] >= 0
        environment = run["environment"][-1]
        assert environment["processor"] and environment["platform"]
        assert {"numpy", "jaxlib", "jax", "keras"} <= set(environment["versions"])


def test_a_stopped_row_resumes_where_it_stopped(convergence, stopped_and_resumed):
    stopped, resumed, tmp = stopped_and_resumed
    assert not stopped.get("complete") and "winner" not in stopped
    trained = {n: r["epochs"] for n, r in stopped["runs"].items() if r["epochs"]}
    assert sum(len(e) for e in trained.values()) == 2
    # Nothing done before the stop was done again or changed.
    for name, epochs in trained.items():
        assert resumed["runs"][name]["epochs"][: len(epochs)] == epochs, name
    assert resumed["complete"] and len(resumed["commands"]) == 2
    # A finished row resumed again is passed over: nothing written.
    before = {p: p.read_bytes() for p in (tmp / "out").rglob("*") if p.is_file()}
    _run(convergence, tmp, "--resume")
    assert {p: p.read_bytes() for p in (tmp / "out").rglob("*") if p.is_file()} == before
    assert not stopped.get("rungs")
    # The other two candidates' first epochs ran in workers (--jobs 2), each
    # recording its own command.
    workers = {name for name, r in resumed["runs"].items()
               for e in r["environment"] if " --until " in e["command"]}
    assert workers >= {"candidate1", "candidate2", "candidate3", "candidate4"} - set(trained)
    with pytest.raises(ValueError, match="different values for: \\['max_epochs'\\]"):
        _run(convergence, tmp, "--resume", "--max-epochs", "4")


def test_a_row_recorded_before_the_seeds_cap_takes_it_on(convergence, tmp_path):
    """The seeds' cap was added while the LSTM row trained: a row recorded
    without it takes on the command's, and a cap below the final ranking's
    is refused."""
    path = str(tmp_path / "row.json")
    settings = {"max_epochs": 80, "seed_max_epochs": 160, "patience": 3}
    old = {k: v for k, v in settings.items() if k != "seed_max_epochs"}
    convergence.RowRecord(path, old, resume=False).save()
    record = convergence.RowRecord(path, settings, resume=True)
    assert record.data["settings"] == settings
    record.save()
    assert convergence.seed_cap(old) == 80 and convergence.seed_cap(settings) == 160
    with pytest.raises(ValueError, match="different values for: \\['seed_max_epochs'\\]"):
        convergence.RowRecord(path, dict(settings, seed_max_epochs=120), resume=True)
    with pytest.raises(ValueError, match="--seed-max-epochs of at least --max-epochs"):
        convergence.main(["--row", "lstm", "--max-epochs", "5", "--seed-max-epochs", "4",
                          "--output", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_a_row_is_passed_over_only_with_its_seeds_tested_and_its_model(
        convergence, tmp_path):
    model = tmp_path / "best_model.keras"
    runs = {"candidate5": {"dynamic": {}}, "seed2": {"dynamic": {}}}

    class Record:
        data = {"complete": True, "seeds": {"1": "candidate5", "2": "seed2"},
                "model": {"path": os.path.relpath(model, ROOT)}}

        def run(self, name):
            return runs[name]

    assert not convergence.row_finished(Record())  # no saved model
    model.write_bytes(b"model")
    assert convergence.row_finished(Record())
    del runs["seed2"]["dynamic"]  # a seed untested
    assert not convergence.row_finished(Record())
    runs["seed2"]["dynamic"] = {}
    Record.data["complete"] = False
    assert not convergence.row_finished(Record())


def test_a_run_whose_checkpoint_is_gone_starts_again_and_keeps_what_it_had(
        convergence, tmp_path):
    """A run resumed on a machine without its checkpoint trains again from
    epoch 1; the epochs it had recorded are kept, not overwritten."""
    first = _run(convergence, tmp_path, "--stop-after-units", "1")
    (name, run), = [(n, r) for n, r in first["runs"].items() if r["epochs"]]
    shutil.rmtree(tmp_path / "work")  # the checkpoint, lost with its machine
    # Its next rung, as the row's worker process runs it.
    again = _run(convergence, tmp_path, "--resume", "--run", name, "--until", "2")
    attempts = again["runs"][name]["earlier_attempts"]
    assert [a["epochs"] for a in attempts] == [run["epochs"]]
    assert "trained again" in attempts[0]["why"]
    assert len(again["runs"][name]["epochs"]) == 2  # from epoch 1 again


def test_the_winner_is_kept_before_its_seeds_train_and_a_row_is_never_overwritten(
        convergence, tmp_path, monkeypatch):
    """Its best weights are copied (float16, with the results) as soon as
    the final rung names it, not after the other seeds' days of training; a
    recorded row is continued only with --resume, and with the candidates
    it recorded."""
    # Every candidate's rungs and the final rung (4 + 2 + 1 epochs), no winner yet.
    _run(convergence, tmp_path, "--stop-after-units", "7")
    path = tmp_path / "out" / "lstm.json"
    recorded = path.read_bytes()
    with pytest.raises(ValueError, match="Expected --resume"):
        _run(convergence, tmp_path)
    assert path.read_bytes() == recorded
    data = json.loads(recorded)
    data["candidates"][0]["learning_rate"] *= 2
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="candidates recorded"):
        _run(convergence, tmp_path, "--resume")
    path.write_bytes(recorded)
    # The seeds' training (in workers) stops before it starts.
    original = convergence.train_all

    def no_seeds(record, units, row, corpus, args):
        if any(name.startswith("seed") for name, *_ in units):
            return False
        return original(record, units, row, corpus, args)

    monkeypatch.setattr(convergence, "train_all", no_seeds)
    row = _run(convergence, tmp_path, "--resume", "--jobs", "2")
    winner = row["runs"][row["winner"]]
    assert "static" not in winner  # not tested yet: that waits for the seeds
    # Ranked at the final ranking's budget (3 epochs), not the seeds' cap.
    assert winner["epoch_cap"] == 3
    assert len(winner["epochs"]) == 3 or winner["converged"]
    kept = os.path.join(ROOT, winner["kept_weights"])
    assert kept.endswith(f"{row['winner']}.float16.npz")
    with np.load(kept) as data, np.load(os.path.join(ROOT, winner["weights"])) as full:
        np.testing.assert_array_equal(data["w0"], full["w0"].astype("float16"))


@pytest.mark.parametrize("row", ["lstm", "mogrifier_lstm", "mogrifier_rlstm"])
def test_each_rows_best_model_is_in_the_checkout_and_not_git_ignored(row):
    import subprocess

    path = f"benchmarks/results/convergence/{row}/best_model.keras"
    try:
        found = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT)
    except OSError:
        pytest.skip("git is not installed")
    if found.returncode == 128:
        pytest.skip("not a git checkout")
    assert found.returncode == 1, f"{path} is ignored by .gitignore"
    # The finished row's model is in the checkout: a clone can load it.
    assert os.path.isfile(os.path.join(ROOT, path)), f"{path} is missing"


def _untested_copy(stopped_and_resumed, tmp, name):
    """The finished row's results (not its --work-dir) copied to `tmp` (once),
    with seed `name`'s tests deleted: a seed trained on a machine that is gone."""
    if not (tmp / "out").exists():
        shutil.copytree(stopped_and_resumed[2] / "out", tmp / "out")
    path = tmp / "out" / "lstm" / f"{name}.json"
    entry = json.loads(path.read_text())
    del entry["static"], entry["dynamic"]
    entry["weights"] = os.path.relpath(tmp / "work" / "best.weights.npz", ROOT)  # gone
    path.write_text(json.dumps(entry))
    return entry


def test_a_seed_tests_from_its_kept_float16_weights_when_the_work_dir_is_gone(
        convergence, stopped_and_resumed, row, tmp_path):
    name = row["winner"]
    entry = _untested_copy(stopped_and_resumed, tmp_path, name)
    again = _run(convergence, tmp_path, "--resume")["runs"][name]
    assert again["epochs"] == entry["epochs"] and "earlier_attempts" not in again
    assert again["static"]["weights"].endswith(f"{name}.float16.npz")
    assert again["dynamic"]["weights"] == again["static"]["weights"]
    # float16 weights: the same validation perplexity to a few parts in 1,000.
    assert again["static"]["valid_perplexity"] == pytest.approx(
        row["runs"][name]["static"]["valid_perplexity"], rel=5e-3)


def test_a_kept_copy_older_than_the_best_epoch_is_not_tested(
        convergence, stopped_and_resumed, row, tmp_path):
    """The winner's float16 copy is made when it wins and again whenever its
    best epoch changes; a copy of an earlier epoch (its machine went before
    the copy was renewed) is not what the seed's test reads: it trains again."""
    name = row["winner"]
    entry = _untested_copy(stopped_and_resumed, tmp_path, name)
    assert entry["kept_weights_epoch"] == entry["best_epoch"]
    entry["kept_weights_epoch"] -= 1
    # A static test of the earlier weights (its machine went before the
    # dynamic one) belongs to the attempt that is over, too.
    entry["static"] = {"test_perplexity": 1.0}
    (tmp_path / "out" / "lstm" / f"{name}.json").write_text(json.dumps(entry))
    again = _run(convergence, tmp_path, "--resume")["runs"][name]
    assert [a["epochs"] for a in again["earlier_attempts"]] == [entry["epochs"]]
    # The old copy belonged to the attempt that is over.
    assert again["earlier_attempts"][0]["kept_weights_epoch"] == entry["kept_weights_epoch"]
    assert again["earlier_attempts"][0]["static"] == entry["static"]
    assert again["kept_weights_epoch"] == again["best_epoch"]
    assert again["static"]["weights"] == again["weights"]  # its float32 file


class _Killed(Exception):
    """The process killed in the middle of a dynamic-evaluation search."""


def test_a_stopped_dynamic_search_resumes_with_the_passes_it_recorded(
        convergence, stopped_and_resumed, row, tmp_path, monkeypatch):
    """Each pass of the η × λ search is written to the run's JSON as it
    ends; a search stopped half-way evaluates only the passes it lacks, and
    only for the same weights."""
    name = row["winner"]
    _untested_copy(stopped_and_resumed, tmp_path, name)
    path = tmp_path / "out" / "lstm" / f"{name}.json"
    original = convergence.search_dynamic
    seen = {}

    def killed_after_two(*args, done=(), on_pass=None, **kwargs):
        def recorded(record):
            on_pass(record)
            if len(json.loads(path.read_text())["dynamic_search"]["passes"]) == 2:
                raise _Killed
        return original(*args, done=done, on_pass=recorded, **kwargs)

    def resumed(*args, done=(), on_pass=None, **kwargs):
        seen.update(done=list(done), new=0)

        def counted(record):
            seen["new"] += 1
            on_pass(record)
        return original(*args, done=done, on_pass=counted, **kwargs)

    monkeypatch.setattr(convergence, "search_dynamic", killed_after_two)
    with pytest.raises(_Killed):
        _run(convergence, tmp_path, "--resume")
    stopped = json.loads(path.read_text())
    assert "dynamic" not in stopped and "static" in stopped
    recorded = stopped["dynamic_search"]["passes"]
    assert len(recorded) == 2 and all(len(p["block_means"]) == 5 for p in recorded)
    monkeypatch.setattr(convergence, "search_dynamic", resumed)
    # Passes made with other weights (a seed trained again) are not reused.
    stale = json.loads(json.dumps(stopped))
    stale["dynamic_search"]["identity"]["best_epoch"] -= 1
    path.write_text(json.dumps(stale))
    again = _run(convergence, tmp_path, "--resume")["runs"][name]
    assert seen["done"] == [] and again["dynamic"]["passes_reused"] == 0
    # The same weights: the two recorded passes are kept, the others made.
    path.write_text(json.dumps(stopped))
    again = _run(convergence, tmp_path, "--resume")["runs"][name]
    assert seen["done"] == recorded and again["dynamic"]["passes_reused"] == 2
    assert "dynamic_search" not in again
    passes = again["dynamic"]["passes"]
    assert len(passes) == 2 + seen["new"] and seen["new"] >= 2
    assert [p["perplexity"] for p in passes[:2]] == [p["perplexity"] for p in recorded]


def test_seeds_whose_weights_are_all_gone_train_again_side_by_side(
        convergence, stopped_and_resumed, row, tmp_path, monkeypatch):
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)  # the workers' own, below
    entries = {}
    for name in row["seeds"].values():
        entries[name] = _untested_copy(stopped_and_resumed, tmp_path, name)
        os.remove(tmp_path / "out" / "lstm" / "weights" / f"{name}.float16.npz")
    # The winner had started again and trained an epoch when its machine
    # went too (no checkpoint): its run is unfinished.
    path = tmp_path / "out" / "lstm" / f"{row['winner']}.json"
    winner = json.loads(path.read_text())
    winner["epochs"] = winner["epochs"][:1]
    winner["converged"] = False
    path.write_text(json.dumps(winner))
    again = _run(convergence, tmp_path, "--resume", "--jobs", "2")
    # The winner stays the winner: its run trains again with the other
    # seeds, each in a worker, not alone as the final rung once more.
    assert (again["winner"], again["final_ranking"]) == (row["winner"], row["final_ranking"])
    for name, entry in entries.items():
        run = again["runs"][name]
        attempts = run["earlier_attempts"]
        kept = entry["epochs"][:1] if name == row["winner"] else entry["epochs"]
        assert attempts[-1]["epochs"] == kept and attempts[-1]["why"]
        assert len(run["epochs"]) == len(entry["epochs"])  # trained again, to its end
        assert " --until " in run["environment"][-1]["command"], name
        # Each worker's allocator on huge pages (`_harness.HUGE_PAGE_TUNABLE`).
        assert "glibc.malloc.hugetlb=1" in run["environment"][-1]["glibc_tunables"], name
        if len(getattr(os, "sched_getaffinity", lambda _: ())(0)) >= 2:
            # Two workers, two free cores: each ran on a core of its own.
            assert run["environment"][-1]["cpus_usable"] == 1, name
        assert run["static"]["weights"] == run["weights"]  # the new float32 file
        assert math.isfinite(run["dynamic"]["test_perplexity"])


def test_seeds_trained_but_untested_are_tested_in_workers(
        convergence, stopped_and_resumed, row, tmp_path, monkeypatch):
    """A session that ended during the seeds' tests: with --jobs, each
    untested seed gets a worker of its own, not a turn in the main process
    after every other seed has trained."""
    for name in row["seeds"].values():
        _untested_copy(stopped_and_resumed, tmp_path, name)
    tested_here = []
    original = convergence.finish_seed

    def finish_seed(record, name, *args, **kwargs):
        if "dynamic" not in record.run(name):
            tested_here.append(name)
        return original(record, name, *args, **kwargs)

    monkeypatch.setattr(convergence, "finish_seed", finish_seed)
    again = _run(convergence, tmp_path, "--resume", "--jobs", "2")
    assert tested_here == []
    for name in row["seeds"].values():
        run = again["runs"][name]
        assert run["epochs"] == row["runs"][name]["epochs"]  # not trained again
        assert run["static"]["weights"].endswith(f"{name}.float16.npz")
        assert math.isfinite(run["dynamic"]["test_perplexity"])


def test_plateau_keeps_the_validated_weights_and_stops(convergence, tmp_path):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    path = str(tmp_path / "best.npz")
    plateau = convergence.Plateau(path, patience=2, min_delta=0.5)
    plateau.set_model(model)
    seen = []
    for epoch, value in enumerate([10.0, 9.0, 8.8, 8.7, 7.0]):
        model.weights[0].assign(np.full((2, 1), float(epoch), "float32"))
        plateau.on_test_end()
        model.weights[0].assign(np.zeros((2, 1), "float32"))  # after validation
        model.stop_training = False
        plateau.on_epoch_end(epoch, {"val_perplexity": value})
        seen.append((plateau.best_epoch, plateau.wait, model.stop_training))
        if epoch == 3:
            with np.load(path) as saved:
                kept_at_stop = saved["w0"].copy()
    # 8.8 and 8.7 are within 0.5 of 9.0: they count towards the patience (the
    # second stops), but each is the best so far, and its weights are kept.
    assert seen[:4] == [(0, 0, False), (1, 0, False), (2, 1, False), (3, 2, True)]
    assert np.all(kept_at_stop == 3.0)
    with np.load(path) as saved:
        assert np.all(saved["w0"] == 4.0)  # epoch 4 improved again (7.0)
    state, _ = plateau.get_resume_state()
    other = convergence.Plateau(path, patience=2, min_delta=0.5)
    other.set_resume_state(state, [])
    assert (other.best, other.best_epoch, other.reference, other.wait) == (7.0, 4, 7.0, 0)
    # A checkpoint written before the reference was kept: its best is it.
    other.set_resume_state({"best": 9.0, "best_epoch": 1, "wait": 1}, [])
    assert (other.best, other.reference, other.wait) == (9.0, 9.0, 1)


class _FakeEvaluator:
    """Per-token losses of a made-up setting surface: a bowl in log η and
    log λ around (`eta`, `lam`), plus the same noise for every setting."""

    def __init__(self, eta, lam, depth=0.01, noise=0.5, seed=0):
        self.eta, self.lam, self.depth = eta, lam, depth
        self.noise = np.random.default_rng(seed).normal(0.0, noise, 100_000)
        self.learning_rate = self.decay_rate = None
        self.calls = []

    def evaluate(self, ids, verbose=0, return_token_losses=False):
        n = len(ids) - 1
        self.calls.append((self.learning_rate, self.decay_rate, n))
        bowl = self.depth * (
            math.log10(self.learning_rate / self.eta) ** 2
            + math.log10(self.decay_rate / self.lam) ** 2
        )
        # Each token's noise differs a little between settings too (the
        # same for the same setting: a pass evaluated again is the same).
        setting = (round(1e6 * math.log10(self.learning_rate)),
                   round(1e6 * math.log10(self.decay_rate)))
        jitter = np.random.default_rng([abs(v) for v in setting]).normal(0.0, 0.05, n)
        return {"token_losses": [4.0 + bowl + self.noise[:n] + jitter]}


def test_the_search_widens_an_edge_and_grows_the_slice_until_separated(convergence):
    valid = np.zeros(40_001, "int32")
    lines = []
    # The best λ lies below the grid (3e-5; the grid's step is ×3): the
    # first widening adds 3.3e-5, still on the edge, the second 1.1e-5, and
    # 3.3e-5 is then interior. The bowl is shallow: 1,000 tokens cannot
    # separate the neighbours, so the slice doubles.
    fake = _FakeEvaluator(eta=3e-5, lam=3e-5)
    found = convergence.search_dynamic(
        fake, valid, lines.append, 1_000, (1e-5, 3e-5, 1e-4), (1e-4, 3e-4, 1e-3), 100,
    )
    assert found["learning_rate"] == 3e-5
    assert found["decay_rate"] == pytest.approx(1e-4 / 3)
    assert found["decay_rates"][:2] == pytest.approx([1e-4 / 9, 1e-4 / 3])
    assert found["on_edge"] == []
    assert found["slice_tokens"] > 1_000 and found["separated"]
    assert all(g >= 2.0 for g in found["separation"].values())
    assert len(lines) == len(fake.calls) == len(found["passes"])


def test_a_stopped_search_resumed_ends_as_one_run_through(convergence):
    valid = np.zeros(40_001, "int32")
    grid = (1_000, (1e-5, 3e-5, 1e-4), (1e-4, 3e-4, 1e-3), 100)
    whole = convergence.search_dynamic(_FakeEvaluator(3e-5, 3e-5), valid, lambda _: None, *grid)
    recorded = []

    def stop_after_seven(record):
        recorded.append(json.loads(json.dumps(record)))  # as the JSON keeps it
        if len(recorded) == 7:
            raise _Killed

    with pytest.raises(_Killed):
        convergence.search_dynamic(_FakeEvaluator(3e-5, 3e-5), valid, lambda _: None, *grid,
                                   on_pass=stop_after_seven)
    fake = _FakeEvaluator(3e-5, 3e-5)
    resumed = convergence.search_dynamic(fake, valid, lambda _: None, *grid, done=recorded)
    assert resumed == whole
    assert len(fake.calls) == len(whole["passes"]) - 7
    assert not {(e, l, n) for e, l, n in fake.calls} & {
        (p["learning_rate"], p["decay_rate"], p["tokens"]) for p in recorded}


def test_separation_is_in_standard_errors_of_block_means(convergence):
    rng = np.random.default_rng(1)
    best = rng.normal(0.0, 1.0, 10_000)
    other = best + 0.1 + rng.normal(0.0, 1.0, 10_000)
    # 100 blocks of 100: the block means' spread is about 0.1, their mean's
    # standard error about 0.01: 0.1 above is about 10 errors.
    assert 7 < convergence.separation(best, other, 100) < 13
    assert math.isnan(convergence.separation(best[:150], other[:150], 100))


def test_the_table_gives_the_seeds_spread_and_every_candidates_ranks(
        convergence, stopped_and_resumed, row):
    text = convergence.table(str(stopped_and_resumed[2] / "out"))
    lines = text.splitlines()
    (line,) = [l for l in lines if l.startswith(f"| lstm | {row['params']:,} | 2 |")]
    for key in ("valid_perplexity", "test_perplexity", "test_perplexity_one_stream",
                "dynamic_test_perplexity"):
        values = row["summary"][key]["values"]
        assert (f"{np.mean(values):.2f} ± {np.std(values, ddof=1):.2f} "
                f"({values[0]:.2f}, {values[1]:.2f})") in line, key
    seeds = [row["runs"][n] for n in row["seeds"].values()]
    assert ", ".join(f"{len(s['epochs'])}{'*' if s['stopped_at_max_epochs'] else ''} "
                     f"({s['best_epoch']})" for s in seeds) in line
    gain = np.mean([100 * s["dynamic"]["gain"] for s in seeds])
    assert line.endswith(f"| {gain:.1f} % |")
    # Each candidate's rank at each cut it reached; the winner's final rank.
    first, second = row["rungs"]
    for name in first["ranked"]:
        (ranks,) = [l for l in lines if l.startswith(f"| lstm | {name} |")]
        assert f"| {first['ranked'].index(name) + 1} of 4 (1 ep.)" in ranks
        if name in second["ranked"]:
            assert f", {second['ranked'].index(name) + 1} of 2 (2 ep.) |" in ranks
        else:
            assert "(2 ep.)" not in ranks
        assert ranks.endswith("| 1 of 1 (3 ep.) (winner) |") == (name == row["winner"])
    # And every run, each once.
    assert sum(l.startswith(f"| lstm | {row['units']} |") for l in lines) == len(row["runs"])


def _captured_figures(monkeypatch):
    """The figures `plot` closes, kept for a look at what it drew."""
    import matplotlib.pyplot as plt

    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda figure: (figures.append(figure), close(figure)))
    return figures


def test_plot_draws_every_row_and_needs_one(
        convergence, stopped_and_resumed, row, tmp_path, monkeypatch):
    path = tmp_path / "curves.png"
    figures = _captured_figures(monkeypatch)
    convergence.main(["--output", str(stopped_and_resumed[2] / "out"), "--plot", str(path)])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The finished row's panel has an inset of its seeds from half the final
    # ranking's budget on, each seed's kept epoch dotted.
    (panel,) = figures[0].axes
    (inset,) = panel.child_axes
    seeds = list(row["seeds"].values())
    start = max(1, row["settings"]["max_epochs"] // 2)
    curves = [l for l in inset.lines if l.get_linestyle() == "-"]
    dots = [l for l in inset.lines if l.get_marker() == "o"]
    assert len(curves) == len(seeds) and len(dots) == len(seeds)
    for name, dot in zip(sorted(seeds), dots):
        entry = row["runs"][name]
        assert list(dot.get_xdata()) == [entry["best_epoch"]]
        assert list(dot.get_ydata()) == [entry["epochs"][entry["best_epoch"] - 1]["valid_perplexity"]]
    assert all(min(c.get_xdata()) == start for c in curves)
    # A seed trained again on another machine: its earlier attempt is dashed
    # in the inset too, from the same epoch on.
    copy = tmp_path / "copy"
    shutil.copytree(stopped_and_resumed[2] / "out", copy)
    name = sorted(seeds)[-1]
    path = copy / "lstm" / f"{name}.json"
    entry = json.loads(path.read_text())
    earlier = [dict(e, valid_perplexity=e["valid_perplexity"] + 1) for e in entry["epochs"]]
    entry["earlier_attempts"] = [{"epochs": earlier, "why": "its machine went"}]
    path.write_text(json.dumps(entry))
    figures.clear()
    convergence.plot(str(copy), str(tmp_path / "again.png"))
    (inset,) = figures[0].axes[0].child_axes
    (dashed,) = [l for l in inset.lines if l.get_linestyle() == "--"]
    assert list(dashed.get_xdata()) == list(range(start, len(earlier) + 1))
    assert list(dashed.get_ydata()) == [e["valid_perplexity"] for e in earlier[start - 1:]]
    with pytest.raises(ValueError, match="Expected a row's JSON"):
        convergence.plot(str(tmp_path / "empty"), str(tmp_path / "none.png"))


def test_plot_marks_a_row_with_no_epoch_yet(convergence, tmp_path, monkeypatch):
    # A row that has just started (its JSON written, no epoch yet) gets a
    # panel that says so, and no empty legend (matplotlib warns of one).
    import json
    import warnings

    out = tmp_path / "out"
    out.mkdir()
    (out / "mogrifier_rlstm.json").write_text(json.dumps(
        {"row": "mogrifier_rlstm", "params": 2649600, "settings": {}, "commands": []}))
    figures = _captured_figures(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        convergence.plot(str(out), str(tmp_path / "curves.png"))
    (axis,) = figures[0].axes
    assert [t.get_text() for t in axis.texts] == ["no epoch recorded yet"]
    assert axis.get_legend() is None
