"""What greedy generation costs on eager PyTorch with nothing of Keras around it (issue 43).

Issue 43 asks PyTorch's one-token generation path to be within 1.15× of a
bare loop. `LanguageModel.generate` on PyTorch runs, per new token, one
decoding step through Keras's layers and `keras.ops` (the carried state
read and written, the logits, the sampler). The bare loop generates the
same ids from the same weights with nothing of Keras: the embedding
lookup, for each layer the package's own fused step
(`keras_mogrifier.backend.torch.recurrent_step`, the input projection
hoisted where the package hoists it), the residual sums, the output layer
as one `addmm` and an `argmax` — the loop of `torch_eager_floor.py`'s
scorer, one token at a time.

PyTorch only, one torch thread (as the other PyTorch benchmarks here), a
2 × 256 `LanguageModel` over a 10k vocabulary, batch 1, a prompt of 20
random ids, `--tokens` new ids (greedy, no stop token); the two paths
interleaved, CPU ms per new token, medians of `--repeats` after a warm-up;
the two outputs must be the same ids.

    python benchmarks/torch_generation_floor.py   # benchmarks/results/torch_generation_floor.json
"""

import numpy as np

import _harness
import per_backend  # benchmarks/per_backend.py, beside this script
from torch_eager_floor import CELLS, bare_parts, run_layers

PROMPT = 20


def bare_generator(model):
    """Greedy continuation of a prompt by a bare PyTorch loop over `model`'s weights."""
    import torch

    table, output_table, bias, layers = bare_parts(model)

    def generate(prompt, new_tokens):
        units = model.backbone.units
        states = [[torch.zeros(1, units), torch.zeros(1, units)] for _ in layers]
        ids = []
        with torch.no_grad():
            x = run_layers(layers, table[prompt], states)
            for _ in range(new_tokens):
                next_id = torch.argmax(torch.addmm(bias, x[-1:], output_table), dim=-1)
                ids.append(next_id)
                x = run_layers(layers, table[next_id], states)
        return torch.cat([prompt] + ids).numpy()

    return generate


def worker(args):
    import keras
    import torch

    torch.set_num_threads(1)
    prompt = np.random.default_rng(0).integers(0, args.vocabulary, (1, PROMPT)).astype("int32")
    rows = []
    for name in args.cells:
        model = per_backend.scoring_model(args, CELLS[name])
        generate = bare_generator(model)
        prompt_ids = torch.as_tensor(prompt[0], dtype=torch.long)
        paths = {
            "package": lambda: np.asarray(keras.ops.convert_to_numpy(model.generate(
                prompt, max_length=PROMPT + args.tokens, stop_token_ids=None)))[0],
            "bare": lambda: generate(prompt_ids, args.tokens),
        }
        outputs = {path: run() for path, run in paths.items()}  # warm-up
        times = _harness.time_interleaved(paths, rounds=args.repeats)
        row = {"cell": name, "same_ids": bool(np.array_equal(
            outputs["package"].astype("int64"), outputs["bare"].astype("int64")))}
        for path in paths:
            row[f"{path}_cpu_ms_per_token"] = times[path].cpu_per(args.tokens)
            row[f"{path}_ms_per_token"] = times[path].per(args.tokens)
        row["package_over_bare"] = (row["package_cpu_ms_per_token"]
                                    / row["bare_cpu_ms_per_token"])
        rows.append(row)
        print("torch", name, {k: (round(v, 4) if isinstance(v, float) else v)
                              for k, v in row.items() if k != "cell"}, flush=True)
    return rows


def main():
    args = per_backend.parse_arguments(
        __doc__.splitlines()[0], CELLS, repeats=5, json_name="torch_generation_floor.json"
    )
    args.backends = ["torch"]
    if args.tokens == 1500:  # per_backend's default is a scoring stream's length
        args.tokens = 100
    results = per_backend.run(__file__, args, worker)
    print("\n| cell | package (CPU ms/token) | bare loop | package / bare | same ids |")
    print("| --- | ---: | ---: | ---: | --- |")
    for row in results["backends"]["torch"]["rows"]:
        print(f"| {row['cell']} | {row['package_cpu_ms_per_token']:.3f} | "
              f"{row['bare_cpu_ms_per_token']:.3f} | {row['package_over_bare']:.2f} | "
              f"{'yes' if row['same_ids'] else 'no'} |")
    per_backend.write_json(results, args.json)


if __name__ == "__main__":
    main()
