"""The setting of the benchmarks that time one thing on every Keras backend.

Shared by `static_windows.py`, `evaluator_paths.py`, `generation_paths.py`
and `torch_eager_floor.py`: their options, the stream and the model they
score, and `run`, which calls the script's worker once per backend, each in
its own process (`_harness.run_each_backend`), one after the other, and
gathers the rows with the load average before and after each (the figure
that says whether the run was quiet).
"""

import os

import _harness


def parse_arguments(description, cells, repeats, json_name, more=None):
    """The options these benchmarks share: backends, cells, the model's size,
    the stream, the repeats, the JSON file (under `benchmarks/results/`), the
    quiet-machine check; `more(parser)` adds a script's own."""
    parser = _harness.argument_parser(
        description, backends=_harness.BACKENDS, quiet=True,
        json_default=os.path.join(_harness.RESULTS, json_name),
    )
    parser.add_argument("--cells", nargs="+", default=list(cells), choices=list(cells))
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--vocabulary", type=int, default=10_000)
    parser.add_argument("--tokens", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=repeats)
    if more is not None:
        more(parser)
    return parser.parse_args()


def run(script, args, worker):
    """`{"command", "quiet_machine", "backends": {backend: {load averages, "rows"}}}`:
    `worker(args)`'s rows on each of `args.backends`, each in a fresh process."""
    return {
        "command": _harness.command_line(script),
        "quiet_machine": _harness.check_quiet(args.max_load_per_cpu, args.on_busy),
        "backends": _harness.run_each_backend(worker, args.backends, args),
    }


def zipf_stream(args):
    """The stream these benchmarks score: `args.tokens + 1` Zipf ids, seed 0."""
    import numpy as np

    rng = np.random.default_rng(0)
    return (rng.zipf(1.2, size=args.tokens + 1) % args.vocabulary).astype("int32")


def scoring_model(args, options):
    """A built 2-layer `LanguageModel` for batch 1 (seed 0), `options` its cell's."""
    import keras

    from keras_mogrifier import LanguageModel

    keras.utils.set_random_seed(0)
    model = LanguageModel(
        args.vocabulary, units=args.units, num_layers=2, batch_size=1, **options
    )
    model.build((1, 5))
    return model


def rows_by_cell(results, cells):
    """`(cell, backend, row)` in table order: cells, then backends."""
    for cell in cells:
        for backend, result in results["backends"].items():
            for row in result["rows"]:
                if row["cell"] == cell:
                    yield cell, backend, row


def write_json(results, path):
    if path:
        _harness.write_json(path, results)
        print(f"wrote {path}")
