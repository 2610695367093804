"""The one-token path of generation against its former path, per backend (issue 29).

`generate` calls the model once per new token, through
`LanguageModel.call_with_cache` (one step of the recurrence from the
carried state). Three changes to that path, timed against the path they
replaced in one process per backend, interleaved:

- the backbone calls its sublayers' `call` directly at inference in full
  precision (`RecurrentBackbone._lean`), skipping Keras's `Layer.__call__`
  and the dropout layers (identities there);
- `CellRNN` no longer prepares the cell's weights once per sequence for a
  sequence of one step (`cell_rnn._prepares_per_sequence`): for a
  Mogrifier cell that preparation (the doublings folded into the matrices,
  the kernel padded) cost more than the step;
- the RLSTM's padding (`rlstm_cell._pad_columns`) is a concatenation, where
  `ops.pad` built a Keras `Operation` object per call.

Former path: the three switched back (patched in this process, around a
second model with the same weights, so that TensorFlow and JAX trace each
path into its own decoding step). Two
smaller changes of the same commit stay on in both (the head skips its
dropout layer at inference; a state write of every row skips the slice
update). The setting is `backends.py`'s: a 2 × 256 `LanguageModel`,
V = 10k, batch 1, greedy, a prompt of 20 ids and `--tokens` new ones.
Reported: median wall and CPU milliseconds per new token, former and new,
and whether both paths generated the same ids.

    python benchmarks/generation_paths.py --tokens 200   # quiet machine; ~5 minutes

Measure on a quiet machine: the load average before and after each backend
is stored with the results (`benchmarks/results/generation_paths.json`).
"""

import contextlib

import _harness
import per_backend  # benchmarks/per_backend.py, beside this script

CELLS = {
    "lstm": {"cell": "lstm"},
    "rlstm": {"cell": "rlstm"},
    "mogrifier_rlstm": {"cell": "mogrifier_rlstm", "mogrifier_rounds": 5, "mogrifier_rank": 32},
}


@contextlib.contextmanager
def former_path():
    """The one-token path as it was: the three changes switched back."""
    from keras import ops

    from keras_mogrifier.layers import cell_rnn
    from keras_mogrifier.layers import rlstm_cell
    from keras_mogrifier.models.recurrent_backbone import RecurrentBackbone

    saved = (RecurrentBackbone._lean, cell_rnn._prepares_per_sequence, rlstm_cell._pad_columns)
    RecurrentBackbone._lean = lambda self, training: False
    cell_rnn._prepares_per_sequence = lambda time_steps: True
    rlstm_cell._pad_columns = lambda x, width: ops.pad(
        x, [(0, 0)] * (len(x.shape) - 1) + [(0, width)]
    )
    try:
        yield
    finally:
        (RecurrentBackbone._lean, cell_rnn._prepares_per_sequence,
         rlstm_cell._pad_columns) = saved


def worker(args):
    import keras
    import numpy as np

    from keras_mogrifier import LanguageModel

    backend = keras.backend.backend()
    prompt = np.random.default_rng(0).integers(0, args.vocabulary, (1, 20)).astype("int32")
    rows = []
    for name in args.cells:
        # One model per path, the same weights: TensorFlow and JAX trace the
        # decoding step once per model (its `Decoder` is kept on the model),
        # so each path needs its own model, traced under that path.
        models = {}
        for path in ("former", "new"):
            keras.utils.set_random_seed(0)
            models[path] = LanguageModel(
                args.vocabulary, units=args.units, num_layers=2, batch_size=1, **CELLS[name]
            )
            models[path].build((1, None))
        models["new"].set_weights(models["former"].get_weights())

        def run(path):
            with former_path() if path == "former" else contextlib.nullcontext():
                return models[path].generate(
                    prompt, max_length=20 + args.tokens, stop_token_ids=None
                )

        outputs = {path: np.asarray(keras.ops.convert_to_numpy(run(path)))
                   for path in ("former", "new")}  # warm-up (and, off PyTorch, the traces)
        times = _harness.time_interleaved(
            {path: (lambda p=path: run(p)) for path in ("former", "new")}, rounds=args.repeats
        )
        row = {"cell": name, "same_ids": bool(np.array_equal(outputs["former"], outputs["new"]))}
        for path in ("former", "new"):
            row[f"{path}_ms_per_token"] = times[path].per(args.tokens)
            row[f"{path}_cpu_ms_per_token"] = times[path].cpu_per(args.tokens)
        row["speedup"] = row["former_ms_per_token"] / row["new_ms_per_token"]
        rows.append(row)
        print(f"{backend} {name}: {row['former_ms_per_token']:.2f} -> "
              f"{row['new_ms_per_token']:.2f} ms/token", flush=True)
    return rows


def main():
    args = per_backend.parse_arguments(
        __doc__.splitlines()[0], CELLS, repeats=3, json_name="generation_paths.json"
    )
    results = per_backend.run(__file__, args, worker)
    print("| cell | backend | generate, former → new (ms/token) | CPU, former → new "
          "(ms/token) | speed-up | same ids |")
    print("| --- | --- | --- | --- | ---: | --- |")
    for cell, backend, row in per_backend.rows_by_cell(results, args.cells):
        print(f"| {cell} | {backend} | {row['former_ms_per_token']:.2f} → "
              f"{row['new_ms_per_token']:.2f} | {row['former_cpu_ms_per_token']:.2f} → "
              f"{row['new_cpu_ms_per_token']:.2f} | {row['speedup']:.2f} | "
              f"{'yes' if row['same_ids'] else 'no'} |")
    per_backend.write_json(results, args.json)


if __name__ == "__main__":
    main()
