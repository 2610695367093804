"""What an epoch of the convergence study costs, and how many workers pay.

The convergence study (`convergence.py`, issue 40) trains each run in a
worker process (`--jobs N` of them at once). This script times that work —
the study's own model, optimizer and callbacks (`convergence.run_config`:
Rectified Adam, divergence recovery, Two-Tailed Averaging, the
`TrainingCheckpoint`), at each row's units, batch 32 × 35 — in fresh
processes on JAX (the backend the study runs on) with the study's worker
flags (`XLA_FLAGS` that ask XLA for one thread, and which it does not
follow: a process free on 2 cores runs a pool of two; pinned to a core,
one — `_harness.one_core_environment`), and gives:

- **per row**, one worker alone: the median `fit` step (s), tokens/s and
  the training part of an epoch (`--train-tokens` / (32 × 35) steps; the
  validation passes come on top);
- **the floor it is measured against**: the tied softmax's three matmuls
  of one step (logits `h·Eᵀ`, and the backward pass's `g·E` and `gᵀ·h`,
  at 1,120 tokens × units × vocabulary), timed alone in the same kind of
  process — the part of the step no implementation of this model avoids;
- **dynamic evaluation** of the row's model as the study's η × λ search
  runs it (one stream, segments of 5), ms per token, and what one pass
  over the search's first validation slice costs;
- **workers side by side**: N processes of the `--workers-row` at once
  (each waits until all are compiled, then times its steps), and the steps
  per second they make together: what `--jobs N` buys on this machine —
  each worker free to run on every core ("shared"), and each on a core of
  its own ("pinned", for N up to the cores this process may use), as
  `convergence.py` places its workers while there are free cores;
- **the allocator** (`--allocator-rounds R`): two of those pinned workers
  with glibc's default allocator and with its huge pages
  (`_harness.HUGE_PAGE_TUNABLE`, which the study's workers start with),
  alternated R times — the one setting that changes how the step's
  memory is mapped, not what it computes.

Every worker starts with `--allocator` (default `huge-pages`, as the
study's workers). Only the allocator's A/B, for instance:

    python benchmarks/convergence_cost.py --rows --workers --allocator-rounds 2 \
        --json benchmarks/results/convergence_allocator.json

    python benchmarks/convergence_cost.py --json benchmarks/results/convergence_cost.json

Run it on a quiet machine (it checks), with the study stopped
(`kill -STOP`): the workers are the only load it means to measure.
"""

import os
import statistics
import sys
import tempfile
import threading
import time

import _harness

_harness.environment(backend="jax")

ROWS = ("lstm", "mogrifier_rlstm", "mogrifier_lstm")
PLACEMENTS = ("shared", "pinned")
ALLOCATORS = ("default", "huge-pages")
# Penn Treebank's training text as the study reads it: 887,521 words and
# 42,068 line ends (`load_corpus` on `ptb.train.txt`) = 929,589 tokens.
PTB_TRAIN_TOKENS = 929_589
# A candidate in the middle of the study's ranges (the time does not depend
# on the values; non-zero dropout draws its masks as the study does).
CANDIDATE = {"learning_rate": 2e-3, "input_dropout": 0.4, "cell_output_dropout": 0.2,
             "state_dropout": 0.3, "output_dropout": 0.3}


def _settings(args):
    import argparse

    import convergence

    namespace = argparse.Namespace(
        parameters=args.parameters, batch_size=args.batch, bptt=args.window,
        candidates=convergence.CANDIDATES, rungs=list(convergence.RUNGS),
        max_epochs=convergence.MAX_EPOCHS,
        seed_max_epochs=convergence.SEED_CAP_FACTOR * convergence.MAX_EPOCHS,
        seeds=list(convergence.SEEDS), max_tokens=None,
        dynamic_learning_rates=[], dynamic_decay_rates=[], dynamic_slice_tokens=0,
        dynamic_statistics_batches=0, dynamic_statistics_batch=0, dynamic_block=0,
    )
    return convergence.study_settings(namespace)


def study_parameters():
    """The study's parameter budget (2.65M)."""
    import paper_tables

    return paper_tables.PARAMETERS


def row_units(args, name):
    """The row's units: the study's JSON's when it has the row, else the
    units whose model is closest to `--parameters` (as the study picks them)."""
    import paper_tables

    import convergence

    recorded = os.path.join(convergence.DEFAULT_OUTPUT, f"{name}.json")
    if args.vocabulary == 10_000 and args.parameters == study_parameters() \
            and os.path.exists(recorded):
        data = _harness.read_json(recorded)
        return data["units"], data["params"]
    row = convergence.row_spec(name)
    return paper_tables.units_for_budget(args.vocabulary, row, _settings(args))


def train_worker(args, name, units, barrier=None, count=1):
    """A worker's `fit` steps: the median and every step's seconds after
    `args.warmup` untimed ones; with `barrier` (a folder), it waits after
    its warm-up until `count` workers are ready there."""
    import keras
    import numpy as np

    import convergence
    from keras_mogrifier.data import StreamDataset
    from keras_mogrifier.pipeline import language_modeling as lm

    settings = _settings(args)
    row = dict(convergence.row_spec(name), units=units)
    model_config, training = convergence.run_config(row, CANDIDATE, settings)
    keras.utils.set_random_seed(1)
    rng = np.random.default_rng(0)
    ids = (rng.zipf(1.2, size=args.batch * args.window * (args.warmup + args.steps + 2))
           % args.vocabulary).astype("int32")
    valid = StreamDataset(ids[: 20 * args.batch * args.window], args.batch, args.window,
                          drop_remainder=False)
    model = lm.build_language_model(args.vocabulary, model_config, args.batch)
    lm.compile_language_model(model, training)
    times = []

    class Steps(keras.callbacks.Callback):
        last = None

        def on_train_batch_end(self, batch, logs=None):
            if batch + 1 == args.warmup and barrier is not None:
                open(os.path.join(barrier, f"{os.getpid()}.ready"), "w").close()
                while len([f for f in os.listdir(barrier) if f.endswith(".ready")]) < count:
                    time.sleep(0.05)
            now = time.perf_counter()
            if batch + 1 > args.warmup:
                times.append(now - self.last)
            self.last = now

    with tempfile.TemporaryDirectory(prefix="convergence_cost_") as folder:
        callbacks = [Steps()] + lm.training_callbacks(
            training, os.path.join(folder, "checkpoint"), valid,
            checkpoint_every_steps=200)
        model.fit(StreamDataset(ids, args.batch, args.window), epochs=1,
                  steps_per_epoch=args.warmup + args.steps, shuffle=False,
                  callbacks=callbacks, verbose=0)
    return {"median_step_s": statistics.median(times), "steps_s": times}


def dynamic_worker(args, name, units):
    """Dynamic evaluation of the row's model as the study's search runs it
    (one stream, segments of 5, Krause's RMS rule, as the search's passes;
    the model untrained, the ids made up): the median milliseconds
    per token of `args.floor_repeats` passes over `args.dynamic_tokens`."""
    import numpy as np

    import convergence
    from keras_mogrifier.evaluation import DynamicEvaluator
    from keras_mogrifier.pipeline import language_modeling as lm

    row = dict(convergence.row_spec(name), units=units)
    model_config, _ = convergence.run_config(row, CANDIDATE, _settings(args))
    model = lm.build_language_model(args.vocabulary, model_config, args.batch)
    evaluator = DynamicEvaluator(model.with_options(batch_size=1, samples=1),
                                 segment_length=convergence.DYNAMIC_SEGMENT,
                                 learning_rate=1e-7, decay_rate=1e-3)
    rng = np.random.default_rng(0)
    ids = (rng.zipf(1.2, size=max(args.dynamic_tokens + 1, 2_000))
           % args.vocabulary).astype("int32")
    # An untrained model on made-up ids: a small η keeps it from diverging
    # (the time per token does not depend on η).
    evaluator.collect_gradient_statistics(ids, batch_size=1, steps=20)
    stream = ids[: args.dynamic_tokens + 1]
    timing = _harness.time_call(lambda: evaluator.evaluate(stream, verbose=0),
                                repeats=args.floor_repeats, warmup=1)
    return {"median_ms_per_token": 1000 * statistics.median(timing.wall) / args.dynamic_tokens}


def softmax_floor_worker(args, units):
    """The tied softmax's three matmuls of one step, timed alone: the
    median seconds of `args.floor_repeats` after one warm-up."""
    import keras
    import numpy as np

    tokens = args.batch * args.window
    rng = np.random.default_rng(0)
    h = keras.ops.convert_to_tensor(rng.standard_normal((tokens, units), "float32"))
    e = keras.ops.convert_to_tensor(rng.standard_normal((args.vocabulary, units), "float32"))
    g = keras.ops.convert_to_tensor(
        rng.standard_normal((tokens, args.vocabulary), "float32"))

    def step():
        logits = keras.ops.matmul(h, keras.ops.transpose(e))
        grad_h = keras.ops.matmul(g, e)
        grad_e = keras.ops.matmul(keras.ops.transpose(g), h)
        for value in (logits, grad_h, grad_e):
            keras.ops.convert_to_numpy(value[:1, :1])  # waits for each

    timing = _harness.time_call(step, repeats=args.floor_repeats, warmup=1)
    return {"median_s": statistics.median(timing.wall), "all_s": timing.wall,
            "flops": 3 * 2 * tokens * units * args.vocabulary}


def worker_environment(allocator, core=""):
    """A worker's environment entries: the study's `XLA_FLAGS`, its core
    (`""`: free to run on every core) and its allocator (`ALLOCATORS`)."""
    if allocator not in ALLOCATORS:
        raise ValueError(f"Expected an allocator in {ALLOCATORS}. Received: {allocator!r}")
    env = {"XLA_FLAGS": _harness.XLA_ONE_THREAD_FLAGS, _harness.CORES_VARIABLE: core}
    env.update(_harness.allocator_environment(huge_pages=allocator == "huge-pages"))
    return env


def run_side_by_side(args, name, units, count, pinned=False, allocator="huge-pages"):
    """`count` train workers at once, timed over the same steps; with
    `pinned`, each on a core of its own; each with `allocator`."""
    cores = _harness.own_cores() if pinned else []
    if pinned and count > len(cores):
        raise ValueError(
            f"Expected at most {len(cores)} pinned workers (a core each). "
            f"Received: {count}"
        )
    results = [None] * count
    errors = []
    with tempfile.TemporaryDirectory(prefix="convergence_cost_barrier_") as barrier:
        def one(index):
            env = worker_environment(allocator, str(cores[index]) if pinned else "")
            try:
                results[index] = _harness.run_in_backend(
                    train_worker, args, name, units, barrier, count, backend="jax",
                    env=env, capture_output=True)
            except Exception as error:  # noqa: BLE001 - re-raised below
                errors.append(error)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]
    return results


def allocator_rounds(args, name, units, rounds):
    """Two workers (or one, on one core) of `name` side by side, each
    pinned to a core, with each of `ALLOCATORS` in turn, `rounds` times:
    a list of `{"allocator", "median_step_s", "load_average"}`."""
    count = min(2, len(_harness.own_cores())) or 1
    found = []
    for _ in range(rounds):
        for allocator in ALLOCATORS:
            results = run_side_by_side(args, name, units, count,
                                       pinned=bool(_harness.own_cores()), allocator=allocator)
            found.append({"allocator": allocator,
                          "median_step_s": [r["median_step_s"] for r in results],
                          "load_average": _harness.load_average()})
            print(f"allocator {allocator}: steps {found[-1]['median_step_s']}",
                  file=sys.stderr, flush=True)
    return found


def allocator_summary(rounds):
    """Each allocator's median step over its rounds and workers, and the
    default's over the huge pages' (per round, then the median)."""
    steps = {a: [s for r in rounds if r["allocator"] == a for s in r["median_step_s"]]
             for a in ALLOCATORS}
    ratios = [statistics.mean(d["median_step_s"]) / statistics.mean(h["median_step_s"])
              for d, h in zip(rounds[0::2], rounds[1::2])]
    return {"median_step_s": {a: statistics.median(v) for a, v in steps.items() if v},
            "default_over_huge_pages": ratios,
            "median_default_over_huge_pages": statistics.median(ratios) if ratios else None}


def main():
    parser = _harness.argument_parser(__doc__, quiet=True, data_dir="optional")
    parser.add_argument("--rows", nargs="*", default=list(ROWS),
                        help="the rows to time alone (none: skip that table)")
    parser.add_argument("--workers-row", default="lstm")
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2, 3],
                        help="how many workers side by side, one run each "
                        "(none: skip that table)")
    parser.add_argument("--allocator", choices=ALLOCATORS, default="huge-pages",
                        help="every worker's allocator: glibc's default, or its "
                        "transparent huge pages (the study's workers)")
    parser.add_argument("--allocator-rounds", type=int, default=0,
                        help="times to alternate the allocators, 2 pinned workers of "
                        "--workers-row each time (0: skip)")
    parser.add_argument("--placements", nargs="+", choices=PLACEMENTS, default=list(PLACEMENTS),
                        help="workers free to run on every core (shared), each on a "
                        "core of its own (pinned; counts up to the usable cores)")
    parser.add_argument("--parameters", type=int, default=None,
                        help="the study's budget (default: its own, 2.65M)")
    parser.add_argument("--vocabulary", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--window", type=int, default=35)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--floor-repeats", type=int, default=10)
    parser.add_argument("--dynamic-tokens", type=int, default=1_000,
                        help="tokens of each timed dynamic-evaluation pass")
    parser.add_argument("--search-tokens", type=int, default=None,
                        help="the search's first validation slice (default: the study's)")
    parser.add_argument("--train-tokens", type=int, default=None,
                        help="an epoch's training tokens (default: --data-dir's, "
                        f"else Penn Treebank's {PTB_TRAIN_TOKENS:,})")
    args = parser.parse_args()
    if args.parameters is None:
        args.parameters = study_parameters()
    if args.search_tokens is None:
        import convergence

        args.search_tokens = convergence.DYNAMIC_SLICE_TOKENS
    if args.allocator_rounds < 0 or any(count < 1 for count in args.workers):
        raise ValueError("Expected --allocator-rounds of at least 0 and --workers of at "
                         f"least 1. Received: --allocator-rounds {args.allocator_rounds}, "
                         f"--workers {args.workers}")
    if args.steps < 1 or args.warmup < 1:
        raise ValueError("Expected --steps and --warmup of at least 1. Received: "
                         f"--steps {args.steps}, --warmup {args.warmup}")
    if args.train_tokens is None:
        if args.data_dir:
            from keras_mogrifier.data import load_corpus

            args.train_tokens = len(load_corpus(args.data_dir).train)
        else:
            args.train_tokens = PTB_TRAIN_TOKENS
    quiet = _harness.check_quiet(args.max_load_per_cpu, args.on_busy)
    step_tokens = args.batch * args.window
    epoch_steps = args.train_tokens // step_tokens
    env = worker_environment(args.allocator)
    del env[_harness.CORES_VARIABLE]  # this process's cores, as before
    rows = {}
    for name in args.rows:
        units, params = row_units(args, name)
        train = _harness.run_in_backend(train_worker, args, name, units, backend="jax",
                                        env=env, capture_output=True)
        floor = _harness.run_in_backend(softmax_floor_worker, args, units, backend="jax",
                                        env=env, capture_output=True)
        dynamic = _harness.run_in_backend(dynamic_worker, args, name, units, backend="jax",
                                          env=env, capture_output=True)
        step = train["median_step_s"]
        rows[name] = {
            "units": units, "params": params, "median_step_s": step,
            "tokens_per_s": step_tokens / step, "epoch_training_s": epoch_steps * step,
            "softmax_floor_s": floor["median_s"],
            "softmax_gflops_per_s": floor["flops"] / floor["median_s"] / 1e9,
            "step_over_softmax_floor": step / floor["median_s"],
            "dynamic_ms_per_token": dynamic["median_ms_per_token"],
            "search_pass_s": dynamic["median_ms_per_token"] * args.search_tokens / 1000,
            "steps_s": train["steps_s"], "softmax_floor_all_s": floor["all_s"],
        }
        print(f"{name}: step {step:.3f} s, softmax floor {floor['median_s']:.3f} s",
              file=sys.stderr, flush=True)
    placements = {placement: {} for placement in args.placements}
    units, _ = row_units(args, args.workers_row)
    for count in args.workers:
        for placement, side_by_side in placements.items():
            if placement == "pinned" and count > len(_harness.own_cores()):
                continue  # a core each: no more workers than cores
            results = run_side_by_side(args, args.workers_row, units, count,
                                       pinned=placement == "pinned",
                                       allocator=args.allocator)
            medians = [r["median_step_s"] for r in results]
            side_by_side[str(count)] = {
                "median_step_s": medians,
                "steps_per_s": sum(1.0 / m for m in medians),
            }
            print(f"{count} worker(s), {placement}: steps {medians}", file=sys.stderr,
                  flush=True)
    allocator = allocator_rounds(args, args.workers_row, units, args.allocator_rounds)
    reference = placements[args.placements[0]]
    alone = (reference[str(min(args.workers))]["steps_per_s"] / min(args.workers)
             if reference else None)
    for placement, side_by_side in placements.items():
        for count, entry in side_by_side.items():
            # Against one worker alone in the first placement (a lone worker
            # pinned to one core and one free to use both differ in threads).
            entry["throughput_over_one"] = entry["steps_per_s"] / alone
            entry["epoch_s_each"] = epoch_steps * statistics.mean(entry["median_step_s"])
            entry["epochs_per_hour"] = 3600 * entry["steps_per_s"] / epoch_steps
            if placement != "shared" and count in placements.get("shared", {}):
                entry["steps_per_s_over_shared"] = (
                    entry["steps_per_s"] / placements["shared"][count]["steps_per_s"])

    print(f"The study's work on JAX, its workers' flags, allocator {args.allocator}; "
          f"batch {args.batch} × {args.window}; an epoch = {epoch_steps} steps "
          f"({args.train_tokens:,} tokens); median of {args.steps} steps after "
          f"{args.warmup}.")
    print_tables(args, rows, placements, allocator)
    if args.json:
        _harness.write_json(args.json, {
            "command": _harness.command_line(__file__, backend="jax"),
            "machine": _harness.machine(), "versions": _harness.versions(),
            "quiet_machine": quiet, "load_average_end": _harness.load_average(),
            "settings": vars(args), "epoch_steps": epoch_steps, "rows": rows,
            "side_by_side": placements.get("shared", {}),
            "side_by_side_pinned": placements.get("pinned", {}),
            "allocator_rounds": allocator,
            "allocator_summary": allocator_summary(allocator) if allocator else None,
        })
    return 0


def print_tables(args, rows, placements, allocator):
    """The Markdown tables of what was measured (a table per part run)."""
    if rows:
        print_rows(args, rows)
    if any(placements.values()):
        print_side_by_side(args, placements)
    if allocator:
        summary = allocator_summary(allocator)
        print()
        print(f"| round | allocator | {args.workers_row} workers' steps, pinned (s) "
              "| load after (1 min; its workers count) |")
        print("| ---: | --- | --- | ---: |")
        for index, entry in enumerate(allocator):
            print(f"| {index // len(ALLOCATORS) + 1} | {entry['allocator']} | "
                  f"{', '.join(f'{m:.3f}' for m in entry['median_step_s'])} | "
                  f"{(entry['load_average'] or ['?'])[0]:.4} |")
        print(f"\nThe default's step over the huge pages', each round: "
              f"{', '.join(f'{r:.2f}' for r in summary['default_over_huge_pages'])}×.")


def print_rows(args, rows):
    """The table of each row's worker alone."""
    print("| row | units | params | step (s) | tokens/s | epoch's training (s) "
          "| softmax matmuls alone (s) | step / softmax | dynamic evaluation (ms/token) "
          f"| a search pass of {args.search_tokens:,} tokens (s) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in rows.items():
        print(f"| {name} | {r['units']} | {r['params']:,} | {r['median_step_s']:.3f} | "
              f"{r['tokens_per_s']:.0f} | {r['epoch_training_s']:.0f} | "
              f"{r['softmax_floor_s']:.3f} ({r['softmax_gflops_per_s']:.0f} GFLOP/s) | "
              f"{r['step_over_softmax_floor']:.2f} | {r['dynamic_ms_per_token']:.2f} | "
              f"{r['search_pass_s']:.0f} |")


def print_side_by_side(args, placements):
    """The table of workers side by side."""
    print()
    print(f"| {args.workers_row} workers at once | placement | step of each (s) "
          "| steps/s together | × one alone | × shared | epoch of each (s) "
          "| epochs an hour together |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for placement, side_by_side in placements.items():
        for count, e in side_by_side.items():
            over = e.get("steps_per_s_over_shared")
            print(f"| {count} | {placement} | "
                  f"{', '.join(f'{m:.3f}' for m in e['median_step_s'])} | "
                  f"{e['steps_per_s']:.2f} | {e['throughput_over_one']:.2f} | "
                  f"{'' if over is None else f'{over:.2f}'} | "
                  f"{e['epoch_s_each']:.0f} | {e['epochs_per_hour']:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
