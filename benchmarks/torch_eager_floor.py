"""What static scoring costs on eager PyTorch with nothing of Keras around it (issue 29).

Static evaluation (`DynamicEvaluator.evaluate(..., adapt=False)`, batch 1)
on PyTorch runs, per window of segments, one model call whose time loop
calls the cell's fused PyTorch step (`keras_mogrifier.backend.torch.
recurrent_step`) once per token and layer. This measures how far that is
from the floor of eager PyTorch: the same weights scored by a bare loop —
the embedding lookup, for each layer the package's own fused step called
directly (the input projection hoisted where the package hoists it), the
output layer as one `addmm` and `cross_entropy` — no Keras layer, no
variable, no state write, and how far both are from JAX's compiled path.

One process per backend (`per_backend.py`), the same model and stream:
on PyTorch the package's path and the bare loop, interleaved, as CPU time
of the process with one torch thread (`torch.set_num_threads(1)`, as the
other PyTorch benchmarks here; with two threads a 2-core machine shared
with anything else collapses, see docs/scaling.md), and their losses
(must agree to float rounding); on JAX the package's path (XLA, one
compiled loop per window). A 2 × 256 `LanguageModel` over a 10k vocabulary,
1,500 tokens of a Zipf stream, windows of 320 tokens (what the evaluator
scores at once for this model), medians of `--repeats` passes after a
warm-up pass.

    python benchmarks/torch_eager_floor.py   # benchmarks/results/torch_eager_floor.json
"""

import numpy as np

import _harness
import per_backend  # benchmarks/per_backend.py, beside this script

CELLS = {
    "rlstm": {"cell": "rlstm"},
    "mogrifier_rlstm": {"cell": "mogrifier_rlstm", "mogrifier_rounds": 5, "mogrifier_rank": 32},
}


def bare_parts(model):
    """`model`'s weights for a bare PyTorch loop: `(table, output_table, bias, layers)`,
    each layer `(cell, weights, hoisted, step)` with the package's fused step."""
    from keras_mogrifier.backend import torch as torch_backend

    backbone, head = model.backbone, model.head
    if not backbone.residual or head.projection is not None or head.dual_layer is not None:
        raise ValueError("Expected the default LanguageModel (residual, tied, no Dual)")
    table = backbone.embedding.embeddings.value
    output_table = head.embedding.embeddings.value.t()
    bias = head.output_bias.value
    layers = []
    for layer in backbone.recurrent_layers:
        cell = layer.cell
        weights = cell.step_weights(per_sequence=True)
        hoisted = cell.hoists_input_projection
        step = torch_backend.recurrent_step(cell, weights, False, hoisted)
        assert step is not None, "the cell has no fused PyTorch step"
        layers.append((cell, weights, hoisted, step))
    return table, output_table, bias, layers


def run_layers(layers, x, states):
    """The residual backbone over embedded tokens `x` `(time, units)`, batch 1:
    every layer's fused step per token, `states` (one `[h, c]` per layer)
    carried in place; returns the head's input, Σ of the layers' outputs."""
    import torch

    layer_outputs = []
    for k, (cell, weights, hoisted, step) in enumerate(layers):
        if hoisted:
            x = cell.project_input(weights, x)
        outputs = []
        state = states[k]
        for x_t in torch.unbind(x[:, None, :], 0):
            h, state = step(x_t, state)
            outputs.append(h)
        states[k] = state
        layer_outputs.append(torch.cat(outputs))
        # The residual backbone: layer l reads Σ_{i<l} hⁱ.
        x = layer_outputs[0]
        for more in layer_outputs[1:]:
            x = x + more
    return x


def bare_scorer(model):
    """Static scoring of a stream by a bare PyTorch loop over `model`'s weights."""
    import torch

    table, output_table, bias, layers = bare_parts(model)

    def score(ids, targets, window):
        losses = []
        units = model.backbone.units
        states = [[torch.zeros(1, units), torch.zeros(1, units)] for _ in layers]
        with torch.no_grad():
            for start in range(0, len(ids), window):
                x = run_layers(layers, table[ids[start:start + window]], states)
                logits = torch.addmm(bias, x, output_table)
                losses.append(torch.nn.functional.cross_entropy(
                    logits, targets[start:start + window], reduction="none"))
        return torch.cat(losses).numpy()

    return score


def worker(args):
    import keras

    from keras_mogrifier import DynamicEvaluator

    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        torch.set_num_threads(1)
    stream = per_backend.zipf_stream(args)
    rows = []
    for name in args.cells:
        model = per_backend.scoring_model(args, CELLS[name])
        evaluator = DynamicEvaluator(model, segment_length=5)
        paths = {"package": lambda: evaluator.evaluate(
            stream, adapt=False, verbose=0, return_token_losses=True)["token_losses"]}
        if backend == "torch":
            score = bare_scorer(model)
            ids = torch.as_tensor(stream[:-1], dtype=torch.long)
            targets = torch.as_tensor(stream[1:], dtype=torch.long)
            paths["bare"] = lambda: score(ids, targets, args.window)
        losses = {path: np.ravel(run()) for path, run in paths.items()}  # warm-up
        times = _harness.time_interleaved(paths, rounds=args.repeats)
        row = {"cell": name}
        for path in paths:
            row[f"{path}_cpu_ms_per_token"] = times[path].cpu_per(args.tokens)
        if "bare" in paths:
            row["max_abs_loss_difference"] = float(
                np.max(np.abs(losses["package"] - losses["bare"])))
        rows.append(row)
        print(backend, name, {k: round(v, 4) for k, v in row.items() if k != "cell"}, flush=True)
    return rows


def main():
    args = per_backend.parse_arguments(
        __doc__.splitlines()[0], CELLS, repeats=5, json_name="torch_eager_floor.json"
    )
    args.window = 320
    if args.backends == list(_harness.BACKENDS):
        args.backends = ["jax", "torch"]
    results = per_backend.run(__file__, args, worker)
    print("\n| cell | JAX, package (CPU ms/token) | PyTorch, package | PyTorch, bare loop "
          "| package / JAX | bare / JAX |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for cell in args.cells:
        jax_row = next(r for r in results["backends"]["jax"]["rows"] if r["cell"] == cell)
        torch_row = next(r for r in results["backends"]["torch"]["rows"] if r["cell"] == cell)
        j = jax_row["package_cpu_ms_per_token"]
        p, b = torch_row["package_cpu_ms_per_token"], torch_row["bare_cpu_ms_per_token"]
        print(f"| {cell} | {j:.3f} | {p:.3f} | {b:.3f} | {p / j:.2f} | {b / j:.2f} |")
    per_backend.write_json(results, args.json)


if __name__ == "__main__":
    main()
