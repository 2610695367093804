"""Decoding speed: `generate` against hand-written decoding loops of the same model.

Three ways to continue prompts with the same `LanguageModel` (random
weights, greedy, no stop token), timed interleaved in one process:

- `generate`: the library's loop, one compiled step per token through the
  carried recurrent state (`keras_mogrifier.generation.Decoder`);
- `step loop (eager)`: what a user writes by hand with the same stateful
  model: `model(tokens[:, None])` then `argmax`, called eagerly;
- `full prefix (eager)`: the loop without carried state: a stateless copy of
  the model re-reads the whole growing text for every new token.

The table gives new tokens per second (rows × new tokens / time) and the
ratio to `generate`.

    python benchmarks/generation.py --units 400 --batch 1 8 --json generation.json
"""

import _harness

_harness.environment()

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

from keras_mogrifier.models import LanguageModel  # noqa: E402


def generate(model, prompts, new_tokens):
    model.generate(prompts, max_length=prompts.shape[1] + new_tokens, stop_token_ids=None)


def step_loop(model, prompts, new_tokens):
    """Hand-written decoding through the carried state, eager calls."""
    model.reset_states()
    logits = model(prompts, training=False)
    tokens = np.argmax(ops.convert_to_numpy(logits[:, -1]), axis=-1)
    out = [tokens]
    for _ in range(new_tokens - 1):
        logits = model(tokens[:, None].astype("int32"), training=False)
        tokens = np.argmax(ops.convert_to_numpy(logits[:, -1]), axis=-1)
        out.append(tokens)
    return np.stack(out, axis=1)


def full_prefix(stateless, prompts, new_tokens):
    """Hand-written decoding without carried state: the prefix every time."""
    text = prompts
    for _ in range(new_tokens):
        logits = stateless(text, training=False)
        tokens = np.argmax(ops.convert_to_numpy(logits[:, -1]), axis=-1)
        text = np.concatenate([text, tokens[:, None].astype("int32")], axis=1)
    return text


def main():
    parser = _harness.argument_parser(__doc__, quiet=True)
    parser.add_argument("--cell", default="mogrifier_lstm")
    parser.add_argument("--units", type=int, default=400)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=10_000)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-length", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-full-prefix", action="store_true")
    args = parser.parse_args()
    quiet = _harness.check_quiet(args.max_load_per_cpu, args.on_busy)
    rows = []
    for batch in args.batch:
        keras.utils.set_random_seed(0)
        model = LanguageModel(
            args.vocab, units=args.units, num_layers=args.layers, cell=args.cell,
            mogrifier_rank=32 if args.cell.startswith("mogrifier") else None,
            batch_size=batch,
        )
        model.build((batch, None))
        prompts = np.random.default_rng(0).integers(
            0, args.vocab, (batch, args.prompt_length)
        ).astype("int32")
        methods = {
            "generate": lambda: generate(model, prompts, args.new_tokens),
            "step loop (eager)": lambda: step_loop(model, prompts, args.new_tokens),
        }
        if not args.no_full_prefix:
            stateless = model.with_options(stateful=False)
            methods["full prefix (eager)"] = lambda: full_prefix(
                stateless, prompts, args.new_tokens
            )
        # Same text from the library's loop and the hand-written one.
        expected = step_loop(model, prompts, args.new_tokens)
        got = model.generate(
            prompts, max_length=args.prompt_length + args.new_tokens, stop_token_ids=None
        )
        same = bool(np.array_equal(np.stack(got)[:, args.prompt_length :], expected))
        # One warm-up call each compiles and traces.
        times = _harness.time_interleaved(methods, rounds=args.rounds, warmup=1)
        base = times["generate"].median
        for name in methods:
            median = times[name].median
            rows.append({
                "batch": batch, "method": name, "seconds": median,
                "tokens_per_s": batch * args.new_tokens / median,
                "time_vs_generate": median / base, "same_text_as_step_loop": same,
            })
    setting = (
        f"backend {keras.backend.backend()}, {args.cell} {args.layers}×{args.units}, "
        f"V={args.vocab}, prompt {args.prompt_length}, {args.new_tokens} new tokens, "
        f"greedy, keras {keras.__version__}"
    )
    print(setting)
    print("| batch | method | new tokens/s | time × generate |")
    print("| ---: | --- | ---: | ---: |")
    for r in rows:
        print(f"| {r['batch']} | {r['method']} | {r['tokens_per_s']:.0f} | "
              f"{r['time_vs_generate']:.2f} |")
    if not all(r["same_text_as_step_loop"] for r in rows):
        print("warning: generate and the step loop gave different greedy text")
    if args.json:
        _harness.write_json(args.json, {"setting": setting, "quiet_machine": quiet,
                                        "rows": rows})


if __name__ == "__main__":
    main()
