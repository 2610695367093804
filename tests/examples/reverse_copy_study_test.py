"""examples/reverse_copy_study.py: a KerasTuner search per (cell, length) at a
fixed parameter count, JSON rows, the figure, and resuming a cut-off study."""

import json
import math

import pytest

from ptb_word_test import _load_example

ARGS = [
    "--cells", "lstm", "mogrifier_lstm", "--lengths", "3", "--vocabulary-size", "5",
    "--parameters", "3000", "--train-examples", "300", "--evaluation-examples", "64",
    "--epochs", "1", "--trials", "2", "--mogrifier-rounds", "2",
]


def test_searches_each_cell_at_equal_parameters_and_resumes(tmp_path):
    study = _load_example("reverse_copy_study")
    results = tmp_path / "study.json"
    figure = tmp_path / "study.png"
    args = ARGS + ["--tuner-dir", str(tmp_path / "tuner"), "--results-json", str(results)]
    rows = study.main(args + ["--figure", str(figure)])
    assert [(r["cell"], r["length"]) for r in rows] == [("lstm", 3), ("mogrifier_lstm", 3)]
    saved = json.loads(results.read_text())
    assert saved["rows"] == json.loads(json.dumps(rows))
    for row in rows:
        # The hidden size follows the embedding size: the budget holds for each.
        assert row["parameters"] == pytest.approx(3000, rel=0.1)
        assert row["embedding_size"] in study.EMBEDDING_SIZES
        assert row["learning_rate"] in study.LEARNING_RATES and row["l2"] in study.L2
        assert len(row["trials"]) == 2
        assert math.isfinite(row["test_cross_entropy"])
        assert row["uniform_cross_entropy"] == pytest.approx(math.log(6))
        # The row reports the best trial (by validation cross-entropy), and
        # the hidden size that gives its embedding the budget.
        best = min(row["trials"], key=lambda t: t["val_cross_entropy"])
        assert {k: row[k] for k in ("embedding_size", "learning_rate", "l2")} == {
            k: best[k] for k in ("embedding_size", "learning_rate", "l2")}
        assert row["units"] == study.ReverseCopyHyperModel(
            row["cell"], 5, 3000, 2, None).units(row["embedding_size"])
    assert figure.stat().st_size > 0
    # Resuming: the points already in the file are not searched again.
    again = study.main(args + ["--resume", "--cells", "lstm"])
    assert again == json.loads(json.dumps(rows))


def test_grid_search_covers_every_combination_and_draws_embedding_sizes(tmp_path):
    study = _load_example("reverse_copy_study")
    figure = tmp_path / "embedding.png"
    rows = study.main([
        "--cells", "lstm", "--lengths", "3", "--vocabulary-size", "5", "--parameters", "3000",
        "--train-examples", "200", "--evaluation-examples", "64", "--epochs", "1",
        "--search", "grid", "--embedding-sizes", "4", "8", "--learning-rates", "0.01",
        "--l2", "0", "--tuner-dir", str(tmp_path / "tuner"),
        "--results-json", str(tmp_path / "grid.json"), "--embedding-figure", str(figure),
    ])
    (row,) = rows
    assert sorted(t["embedding_size"] for t in row["trials"]) == [4, 8]
    assert {t["learning_rate"] for t in row["trials"]} == {0.01}
    # Each embedding size gets its own hidden size: the budget holds for both.
    assert figure.stat().st_size > 0


@pytest.mark.parametrize("flag, value", [("--lengths", "0"), ("--embedding-sizes", "-8"),
                                         ("--learning-rates", "0"), ("--l2", "-0.00001")])
def test_nonsense_settings_are_refused(flag, value, capsys):
    study = _load_example("reverse_copy_study")
    with pytest.raises(SystemExit):
        study.parse_args([flag, value])
    assert "must be" in capsys.readouterr().err
