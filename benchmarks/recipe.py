"""Adam against RectifiedAdam + Two-Tailed Averaging, same budget, on PTB.

Trains the same small language model (`tiny` preset) with `run_experiment`
under each configuration in `--runs` (by default Adam, and RectifiedAdam
wrapped in Two-Tailed Averaging evaluated every `--averaging-frequency`
steps; "Adam + Two-Tailed Averaging" and "RectifiedAdam" separate the two
ingredients), same learning rate, epochs and tokens.
Prints the validation perplexity after every epoch and the final
validation/test perplexity, writes JSON, and draws the two curves as an SVG
(no plotting library needed).

    python benchmarks/recipe.py --data-dir ../shared/data/ptb --epochs 4 \\
        --max-tokens 200000 --json benchmarks/results/recipe.json \\
        --svg docs/recipe_curves.svg
"""

import _harness

_harness.environment()

from keras_mogrifier.data import load_corpus  # noqa: E402
from keras_mogrifier.pipeline import run_experiment  # noqa: E402

RUNS = {
    "Adam": {"optimizer": "adam"},
    "Adam + Two-Tailed Averaging": {"optimizer": "adam", "two_tailed_averaging": True},
    "RectifiedAdam": {"optimizer": "radam"},
    "RectifiedAdam + Two-Tailed Averaging": {
        "optimizer": "radam",
        "two_tailed_averaging": True,
    },
}


def svg_plot(curves, path, title):
    """A minimal SVG line plot of `{label: [values per epoch]}`."""
    width, height, pad = 560, 340, 50
    values = [v for c in curves.values() for v in c]
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    epochs = max(len(c) for c in curves.values())
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]

    def xy(i, v):
        x = pad + (width - 2 * pad) * (i / max(1, epochs - 1))
        y = height - pad - (height - 2 * pad) * ((v - lo) / span)
        return x, y

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<text x="{width / 2}" y="20" text-anchor="middle">{title}</text>',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
        f'<text x="{width / 2}" y="{height - 12}" text-anchor="middle">epoch</text>',
        f'<text x="12" y="{height / 2}" transform="rotate(-90 12 {height / 2})" '
        'text-anchor="middle">validation perplexity</text>',
    ]
    for k in range(5):
        v = lo + span * k / 4
        _, y = xy(0, v)
        parts.append(f'<text x="{pad - 6}" y="{y + 4}" text-anchor="end">{v:.0f}</text>')
    for i in range(epochs):
        x, _ = xy(i, lo)
        parts.append(f'<text x="{x}" y="{height - pad + 16}" text-anchor="middle">{i + 1}</text>')
    for (label, curve), colour in zip(curves.items(), colours):
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, v) for i, v in enumerate(curve)))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        ly = pad + 18 * list(curves).index(label)
        parts.append(f'<text x="{width - pad}" y="{ly}" text-anchor="end" fill="{colour}">{label}</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts))


def main():
    parser = _harness.argument_parser(__doc__, data_dir="required")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=200_000)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--averaging-frequency", type=int, default=100)
    parser.add_argument(
        "--runs", nargs="+", choices=sorted(RUNS),
        default=["Adam", "RectifiedAdam + Two-Tailed Averaging"],
        help="Which configurations to train (default: the two of the issue).",
    )
    parser.add_argument("--svg")
    args = parser.parse_args()
    corpus = load_corpus(args.data_dir)
    rows = {}
    for label in args.runs:
        training = RUNS[label]
        results = run_experiment(
            corpus, "tiny",
            training_overrides={
                "epochs": args.epochs, "max_tokens": args.max_tokens,
                "learning_rate": args.learning_rate,
                "averaging_frequency": args.averaging_frequency, **training,
            },
            dynamic=False, verbose=2,
        )
        rows[label] = {
            "valid_curve": results["valid_perplexity_curve"],
            "valid_perplexity": results["valid_perplexity"],
            "test_perplexity": results["test_perplexity"],
        }
        print("| run | per-epoch validation perplexity | final valid | final test |")
        print("| --- | --- | ---: | ---: |")
        for name, r in rows.items():
            curve = ", ".join(f"{v:.1f}" for v in r["valid_curve"])
            print(f"| {name} | {curve} | {r['valid_perplexity']:.1f} | {r['test_perplexity']:.1f} |")
        if args.json:
            _harness.write_json(args.json, {"settings": vars(args), "runs": rows})
        if args.svg:
            svg_plot({k: r["valid_curve"] for k, r in rows.items()}, args.svg,
                     f"PTB, tiny preset, {args.max_tokens} tokens/epoch")


if __name__ == "__main__":
    main()
