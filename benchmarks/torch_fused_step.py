"""PyTorch's fused cell step against the cell's own `keras.ops` step (issue 29).

On the PyTorch backend `CellRNN` runs the plain LSTM and RLSTM cells' time
step in PyTorch's own operations (`keras_mogrifier.backend.torch.recurrent_step`).
This times, in one process and interleaved, the package's path with that
step and with the cell's own step (the backend's step switched off), as CPU
seconds of the process (`time.process_time`, less sensitive than wall time
to other processes on a shared machine):

- static evaluation: `DynamicEvaluator.evaluate(..., adapt=False)` on 300
  tokens, batch 1, segments of 5, a 2 × 256 model over a 10k vocabulary;
- a training step: `train_on_batch` on (32, 35) ids, input and output
  dropout 0.3, and state dropout `--state-dropout` (0 by default; the
  fused step applies with it too since 2026-11-26).

Cells: `lstm`, `rlstm`, and the Mogrifier cells with 5 rounds of rank 32
(`mogrifier_lstm`, `mogrifier_rlstm`: fused since 2026-11-26), the
`backends.py` settings.

Medians of `--repeats` alternations; the losses of both paths are stored
(they must be equal), and the ATen calls per token of one evaluation pass
of 100 tokens on each path (`torch.profiler`).

    KERAS_BACKEND=torch python benchmarks/torch_fused_step.py --json out.json
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

CELLS = {
    "lstm": {"cell": "lstm"},
    "rlstm": {"cell": "rlstm"},
    "mogrifier_lstm": {"cell": "mogrifier_lstm", "mogrifier_rounds": 5, "mogrifier_rank": 32},
    "mogrifier_rlstm": {"cell": "mogrifier_rlstm", "mogrifier_rounds": 5, "mogrifier_rank": 32},
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cells", nargs="+", default=["rlstm", "lstm"], choices=list(CELLS))
    parser.add_argument("--state-dropout", type=float, default=0.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    import keras
    import torch

    if keras.backend.backend() != "torch":
        sys.exit("Run with KERAS_BACKEND=torch.")
    torch.set_num_threads(1)
    import keras_mogrifier.backend.torch as torch_backend
    from keras_mogrifier import LanguageModel
    from keras_mogrifier.evaluation import DynamicEvaluator

    fused_step = torch_backend.recurrent_step
    paths = {"fused": fused_step, "keras_ops": lambda *a: None}
    result = {"command": "python " + " ".join(sys.argv), "machine": platform.processor()
              or platform.machine(), "cpus": os.cpu_count(),
              "load_average_before": list(os.getloadavg()), "torch_threads": 1,
              "state_dropout": args.state_dropout, "rows": []}
    for cell in args.cells:
        row = {"cell": cell}
        model = LanguageModel(10000, units=256, num_layers=2, batch_size=1, **CELLS[cell])
        model.build((1, 35))
        evaluator = DynamicEvaluator(model, segment_length=5)
        ids = np.random.RandomState(0).randint(0, 10000, size=301)
        evaluator.evaluate(ids, adapt=False, verbose=0)
        times, losses = {k: [] for k in paths}, {}
        for _ in range(args.repeats):
            for name, step in paths.items():
                torch_backend.recurrent_step = step
                start = time.process_time()
                losses[name] = float(evaluator.evaluate(ids, adapt=False, verbose=0)["loss"])
                times[name].append(1000 * (time.process_time() - start) / 300)
        row["static_cpu_ms_per_token"] = {k: statistics.median(v) for k, v in times.items()}
        row["aten_calls_per_token"] = {}
        for name, step in paths.items():
            torch_backend.recurrent_step = step
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                evaluator.evaluate(ids[:101], adapt=False, verbose=0)
            row["aten_calls_per_token"][name] = sum(
                e.count for e in prof.key_averages() if e.key.startswith("aten::")) / 100
        row["static_loss"] = losses
        trained = LanguageModel(10000, units=256, num_layers=2, batch_size=32, **CELLS[cell],
                                input_dropout=0.3, output_dropout=0.3,
                                state_dropout=args.state_dropout)
        trained.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True))
        x = np.random.RandomState(1).randint(0, 10000, size=(32, 35))
        y = np.roll(x, -1, axis=1)
        trained.train_on_batch(x, y)
        times = {k: [] for k in paths}
        for _ in range(args.repeats):
            for name, step in paths.items():
                torch_backend.recurrent_step = step
                start = time.process_time()
                for _ in range(2):
                    trained.train_on_batch(x, y)
                times[name].append(1000 * (time.process_time() - start) / 2)
        row["train_step_cpu_ms"] = {k: statistics.median(v) for k, v in times.items()}
        torch_backend.recurrent_step = fused_step
        row["static_fused_over_keras_ops"] = (row["static_cpu_ms_per_token"]["fused"]
                                              / row["static_cpu_ms_per_token"]["keras_ops"])
        row["train_fused_over_keras_ops"] = (row["train_step_cpu_ms"]["fused"]
                                             / row["train_step_cpu_ms"]["keras_ops"])
        result["rows"].append(row)
        print(f"{cell}: static {row['static_cpu_ms_per_token']['keras_ops']:.3f} -> "
              f"{row['static_cpu_ms_per_token']['fused']:.3f} CPU ms/token "
              f"({row['static_fused_over_keras_ops']:.2f}×); train step "
              f"{row['train_step_cpu_ms']['keras_ops']:.1f} -> "
              f"{row['train_step_cpu_ms']['fused']:.1f} ms "
              f"({row['train_fused_over_keras_ops']:.2f}×); ATen calls per token "
              f"{row['aten_calls_per_token']}; losses {losses}", flush=True)
    result["load_average_after"] = list(os.getloadavg())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
