"""benchmarks/paper_tables.py: equal budgets and tuning per row, one JSON
written as it grows, resuming, and re-training a recorded row."""

import json
import math
import os

import pytest

from testing import load_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A tiny study on the embedded corpus: 2 trials of 2 epochs, 2 epochs, 2 seeds.
TRIAL_EPOCHS = 2
SETTINGS = [
    "--parameters", "20000", "--trials", "2", "--trial-epochs", str(TRIAL_EPOCHS),
    "--final-epochs", "2", "--seeds", "3", "4", "--max-tokens", "1200",
    "--batch-size", "4", "--bptt", "10", "--dynamic-tuning-tokens", "200",
    "--statistics-batches", "2",
]


# The study's runs are made on JAX (the script's default): the tests that
# train run there only; the library pieces they drive (tuner, pipeline,
# dynamic evaluation, checkpoints) are tested on every backend in their own
# files, and this file's other tests run everywhere.
trains = pytest.mark.skipif(
    os.environ.get("KERAS_BACKEND", "tensorflow") != "jax",
    reason="the study's training runs on JAX",
)


def _load():
    return load_module(os.path.join(ROOT, "benchmarks", "paper_tables.py"), "paper_tables")


@pytest.fixture(scope="module")
def paper_tables():
    return _load()


@pytest.fixture(scope="module")
def study(paper_tables, tmp_path_factory):
    """Two base rows of a tiny study; the JSON and the work directory."""
    tmp = tmp_path_factory.mktemp("study")
    paths = ["--json", str(tmp / "study.json"), "--work-dir", str(tmp / "work")]
    paper_tables.main(SETTINGS + paths + ["--rows", "lstm", "mogrifier_rlstm"])
    return tmp, paths


@trains
def test_rows_have_equal_budgets_equal_tuning_and_the_schema(study, paper_tables):
    tmp, _ = study
    data = json.loads((tmp / "study.json").read_text())
    assert data["settings"]["seeds"] == [3, 4] and "command" in data
    rows = {row["name"]: row for row in data["rows"]}
    assert sorted(rows) == ["lstm", "mogrifier_rlstm"]
    for row in rows.values():
        for key in ("name", "cell", "params", "units", "hyperparameters", "trials",
                    "valid_perplexity_by_epoch", "epochs_trained", "static", "dynamic",
                    "seeds", "tokens_per_second", "hours", "seed", "commit",
                    "complete", "command"):
            assert key in row, key
        assert row["complete"] and row["epochs_trained"] == 2 and row["seed"] == 3
        assert abs(row["params"] - 20000) <= 0.03 * 20000
        assert [s["seed"] for s in row["seeds"]] == [3, 4]
        assert len(row["trials"]) == 2
        assert all(math.isfinite(t["valid_perplexity"]) for t in row["trials"])
        # Every trial epoch's validation perplexity, the last one the score
        # (KerasTuner itself keeps only the best epoch's).
        for trial in row["trials"]:
            curve = trial["valid_perplexity_by_epoch"]
            assert len(curve) == TRIAL_EPOCHS
            assert trial["valid_perplexity"] == pytest.approx(min(curve))
        # The chosen setting is the trial with the best validation perplexity.
        best = min(row["trials"], key=lambda t: t["valid_perplexity"])
        chosen = row["hyperparameters"]
        assert chosen["training"]["learning_rate"] == best["hyperparameters"]["learning_rate"]
        assert chosen["model"]["input_dropout"] == best["hyperparameters"]["input_dropout"]
        assert chosen["model"]["units"] == row["units"]
        # Adam's ε as the recorded study ran (not the hypermodel's default).
        assert chosen["training"]["epsilon"] == paper_tables.ADAM_EPSILON == 1e-7
        # Means over the seeds, and the first seed's curve.
        tests = [s["static"]["test"] for s in row["seeds"]]
        assert row["static"]["test"] == pytest.approx(sum(tests) / 2)
        assert row["spread"]["static_test"] == pytest.approx(max(tests) - min(tests))
        assert row["valid_perplexity_by_epoch"] == row["seeds"][0]["valid_perplexity_by_epoch"]
        assert len(row["valid_perplexity_by_epoch"]) == 2
        dynamic = [s["dynamic"]["test"] for s in row["seeds"]]
        assert row["dynamic"]["test"] == pytest.approx(sum(dynamic) / 2)
    # Equal tuning: the same candidate settings for every row (same seed,
    # same space), and the same searched names.
    lstm, mog = rows["lstm"], rows["mogrifier_rlstm"]
    assert [t["hyperparameters"] for t in lstm["trials"]] == [
        t["hyperparameters"] for t in mog["trials"]
    ]
    assert lstm["searched"] == mog["searched"] == sorted(
        ["learning_rate", "input_dropout", "cell_output_dropout", "state_dropout",
         "output_dropout"]
    )
    assert "mogrifier_rounds" not in lstm["hyperparameters"]["model"]
    assert mog["hyperparameters"]["model"]["mogrifier_rounds"] == 5


@trains
def test_resume_skips_finished_work_and_refuses_other_settings(paper_tables, study):
    tmp, paths = study
    before = (tmp / "study.json").read_text()
    paper_tables.main(SETTINGS + paths + ["--rows", "lstm", "--resume"])
    assert (tmp / "study.json").read_text() == before
    changed = [a if a != "20000" else "30000" for a in SETTINGS]
    with pytest.raises(ValueError, match="parameters"):
        paper_tables.main(changed + paths + ["--resume"])


@trains
def test_an_interrupted_row_continues_from_its_last_trial(paper_tables, study, tmp_path):
    tmp, paths = study
    data = json.loads((tmp / "study.json").read_text())
    row = next(r for r in data["rows"] if r["name"] == "lstm")
    # Cut the row back to after its first trial, as a stop would leave it.
    row.update(trials=row["trials"][:1], seeds=[], complete=False,
               hyperparameters=None)
    json_path = tmp_path / "cut.json"
    json_path.write_text(json.dumps({**data, "rows": [row]}))
    work = tmp_path / "work"
    paper_tables.main(SETTINGS + ["--json", str(json_path), "--work-dir", str(work),
                                  "--rows", "lstm", "--resume"])
    resumed = json.loads(json_path.read_text())["rows"][0]
    assert resumed["complete"] and len(resumed["trials"]) == 2
    # The first trial was kept as it was, not run again.
    assert resumed["trials"][0] == row["trials"][0]


@trains
def test_a_recorded_row_retrains_its_first_epoch(paper_tables, study, tmp_path):
    tmp, paths = study
    out = tmp_path / "check"
    paper_tables.main(["--json", str(tmp / "study.json"), "--work-dir",
                       str(tmp_path / "work"), "--row", "mogrifier_rlstm",
                       "--epochs", "1", "--output", str(out), "--no-dynamic"])
    again = json.loads((out / "mogrifier_rlstm.json").read_text())
    recorded = next(r for r in json.loads((tmp / "study.json").read_text())["rows"]
                    if r["name"] == "mogrifier_rlstm")
    assert again["epochs_trained"] == 1 and not again["complete"]
    assert again["hyperparameters"] == recorded["hyperparameters"]
    # Same seed, the first epoch of the row's own (2-epoch) schedule.
    assert again["valid_perplexity_by_epoch"][0] == pytest.approx(
        recorded["valid_perplexity_by_epoch"][0], rel=0.03
    )
    assert again["recorded_first_epoch_valid_perplexity"] == (
        recorded["valid_perplexity_by_epoch"][0]
    )


def test_ablations_are_planned_on_the_best_base_row(paper_tables, tmp_path):
    study = paper_tables.Study(str(tmp_path / "s.json"), {"x": 1}, "cmd", resume=False)
    assert [p[0] for p in paper_tables.planned_rows(study)] == list(paper_tables.BASE_ROWS)
    for name, valid in zip(paper_tables.BASE_ROWS, (90.0, 85.0, 88.0, 86.0)):
        study.data["rows"].append(
            {"name": name, "cell": name, "complete": True, "static": {"valid": valid}}
        )
    plan = paper_tables.planned_rows(study)
    assert plan[4:] == [
        ("mogrifier_lstm+dual", "mogrifier_lstm", {"dual": True}),
        ("mogrifier_lstm+samples2", "mogrifier_lstm", {"samples": 2}),
    ]


def _gpu_json(path, cells=("lstm", "mogrifier_rlstm")):
    """A benchmarks/gpu.py part-b JSON of 2-epoch runs; a third run cut short."""
    runs = [{
        "cell": cell, "parameters": 1000 + i, "model": {"units": 8 + i},
        "training": {"batch_size": 4}, "train_epochs": 2, "train_steps_total": None,
        "train_seconds_budget": 99.0, "train_seconds": 36.0, "epochs_done": 2.0,
        "tokens_per_s": 500.0 + i, "epoch_end_seconds": [18.0, 36.0],
        "history": {"val_perplexity": [300.0 - i, 200.0 - i]},
        "valid_perplexity_tau1": 200.0 - i, "test_perplexity_tau1": 190.0 - i,
    } for i, cell in enumerate(cells)]
    runs.append(dict(runs[0], cell="rlstm", test_perplexity_tau1=None))
    path.write_text(json.dumps({
        "command": "python gpu.py --parts b --train-epochs 2", "gpu": "a GPU",
        "part_b_note": "untuned", "part_b": {"jax": {"rows": runs}},
    }))
    return str(path)


@trains
def test_gpu_rows_join_the_json_apart_from_the_study(paper_tables, study, tmp_path, capsys):
    tmp, _ = study
    json_path = tmp_path / "study.json"
    json_path.write_text((tmp / "study.json").read_text())
    before = json.loads(json_path.read_text())["rows"]
    gpu = _gpu_json(tmp_path / "gpu.json")
    for _ in range(2):  # adding again replaces, by name
        paper_tables.main(["--json", str(json_path), "--add-gpu-rows", gpu])
    rows = json.loads(json_path.read_text())["rows"]
    assert rows[:len(before)] == before
    added = rows[len(before):]
    assert [r["name"] for r in added] == [
        "paper24m_lstm_2epochs", "paper24m_mogrifier_rlstm_2epochs"]
    assert added[1]["static"] == {"valid_tau1": 199.0, "test_tau1": 189.0}
    assert added[1]["valid_perplexity_by_epoch"] == [299.0, 199.0]
    assert added[1]["params"] == 1001 and added[1]["units"] == 9
    assert all(r["study"] == paper_tables.GPU_STUDY and r["complete"] for r in added)
    assert paper_tables.study_rows(rows) == before
    capsys.readouterr()
    paper_tables.main(["--json", str(json_path), "--table"])
    cpu_table, gpu_table = capsys.readouterr().out.split("on one GPU")
    assert "paper24m" not in cpu_table and "| lstm |" in cpu_table
    assert "| paper24m_mogrifier_rlstm_2epochs | 1,001 | 2.00 | 501 | 199.0 | 189.0 |" in gpu_table
    with pytest.raises(ValueError, match="benchmarks/gpu.py"):
        paper_tables.main(["--json", str(json_path), "--row", "paper24m_lstm_2epochs",
                           "--output", str(tmp_path / "check")])


def test_a_gpu_row_may_not_take_a_study_rows_name(paper_tables, tmp_path):
    json_path = tmp_path / "study.json"
    json_path.write_text(json.dumps({"settings": {}, "rows": [
        {"name": "paper24m_lstm_2epochs", "complete": True}]}))
    with pytest.raises(ValueError, match="unused by the study's rows"):
        paper_tables.add_gpu_rows(str(json_path), [_gpu_json(tmp_path / "gpu.json")])


@pytest.mark.parametrize("argv, message", [
    (["--trials", "0"], "--trials"),
    (["--seeds", "1", "1"], "distinct"),
    (["--row", "lstm"], "--output"),
])
def test_nonsense_settings_are_refused(paper_tables, argv, message, capsys):
    with pytest.raises(SystemExit):
        paper_tables.parse_args(argv)
    assert message in capsys.readouterr().err
