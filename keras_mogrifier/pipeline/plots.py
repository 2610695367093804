"""The picture of a run: learning curves and what dynamic evaluation gains."""

import math
import os

import numpy as np


def running_perplexities(static, dynamic):
    """Running (cumulative) perplexity of two per-token loss streams, and their ratio.

    Returns:
        `(tokens, static_ppl, dynamic_ppl, gain)`: the token count 1…N, the
        perplexity of each stream over its first k tokens, and
        `1 − dynamic_ppl / static_ppl` (the relative reduction so far).
    """
    static = np.asarray(static, "float64").ravel()
    dynamic = np.asarray(dynamic, "float64").ravel()
    tokens = np.arange(1, len(static) + 1)
    static_mean = np.cumsum(static) / tokens
    dynamic_mean = np.cumsum(dynamic) / tokens
    return (
        tokens,
        np.exp(static_mean),
        np.exp(dynamic_mean),
        1.0 - np.exp(dynamic_mean - static_mean),
    )


def plot_run(results, path):
    """Draws `results` of `run_experiment` to the PNG file `path`.

    Left: training and validation perplexity per epoch. With dynamic
    evaluation, middle: the running perplexity of the test stream, static
    and dynamic (the same τ, one stream), over its first k tokens (from
    the 50th on); right: the gain so far, `1 − dynamic / static` in
    percent — adaptation needs some text before it pays off. Log axes
    carry ticks at round values inside the range of the data.

    Needs matplotlib (the `plot` extra: `pip install -e ".[plot]"`).

    Returns:
        `path`.
    """
    try:
        import matplotlib
    except ImportError as error:  # pragma: no cover - the extra is installed in tests
        raise ImportError(
            "Expected matplotlib for the plot: pip install -e '.[plot]'"
        ) from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator
    from matplotlib.ticker import MaxNLocator
    from matplotlib.ticker import NullLocator
    from matplotlib.ticker import PercentFormatter

    curves = results.get("test_token_losses")
    panels = 3 if curves else 1
    fig, axes = plt.subplots(1, panels, figsize=(4.6 * panels, 3.6), squeeze=False)
    ax = axes[0][0]
    # Every epoch from the first (a resumed run's curves hold the epochs
    # before it; None where an older checkpoint did not keep them).
    train_points = [(e, p) for e, p in enumerate(
        results.get("train_perplexity_curve") or [], 1) if p is not None]
    valid_points = [(e, p) for e, p in enumerate(
        results.get("valid_perplexity_curve") or [], 1) if p is not None]
    train = [p for _, p in train_points]
    valid = [p for _, p in valid_points]
    if train:
        ax.plot([e for e, _ in train_points], train, "o-", label="training")
    if valid:
        ax.plot([e for e, _ in valid_points], valid, "o-", label="validation")
    ax.set_xlabel("epoch")
    ax.set_ylabel("perplexity")
    _log_axis(ax.yaxis, train + valid, FixedLocator, NullLocator)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(
        f"{results.get('preset', '')} preset, {results.get('corpus_source', '')} corpus",
        fontsize=10,
    )
    ax.legend()
    if curves:
        tokens, static, dynamic, gain = running_perplexities(
            curves["static"], curves["dynamic"]
        )
        # The running figures of the first tokens swing widely: drawn from
        # the 50th token (or a tenth of a short stream) on.
        first = min(49, len(tokens) // 10)
        tokens, static, dynamic, gain = (
            a[first:] for a in (tokens, static, dynamic, gain)
        )
        tau = results.get("temperature")
        label = f"τ {tau:.2f}, 1 stream" if tau is not None else "1 stream"
        ax = axes[0][1]
        ax.plot(tokens, static, label="static")
        ax.plot(tokens, dynamic, label="dynamic")
        ax.set_xscale("log")
        _log_axis(ax.xaxis, tokens, FixedLocator, NullLocator)
        _log_axis(ax.yaxis, np.concatenate([static, dynamic]), FixedLocator, NullLocator)
        ax.set_xlabel("tokens of the test text read")
        ax.set_ylabel("perplexity so far")
        ax.set_title(f"test perplexity as the text is read ({label})", fontsize=10)
        ax.legend()
        ax = axes[0][2]
        ax.plot(tokens, 100 * gain, color="C2")
        ax.axhline(0.0, color="0.6", linewidth=0.8)
        ax.set_xscale("log")
        _log_axis(ax.xaxis, tokens, FixedLocator, NullLocator)
        ax.yaxis.set_major_formatter(PercentFormatter(decimals=0))
        ax.set_ylim(min(-5.0, 100 * gain.min() - 2), max(5.0, 100 * gain.max() + 2))
        ax.set_xlabel("tokens of the test text read")
        ax.set_ylabel("1 − dynamic / static perplexity")
        ax.set_title(
            f"gain of dynamic evaluation: {100 * gain[-1]:.1f} % at the end",
            fontsize=10,
        )
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def log_ticks(values):
    """Round tick values (1, 2, 5 × 10ᵏ, or finer) inside the range of `values`.

    At least two ticks whenever the range allows: a perplexity curve from 31
    to 56 gets 35, 40, 45, 50, 55 rather than the decade ticks 10 and 100
    around it, which a log axis would show by default.
    """
    values = np.asarray([v for v in np.ravel(values) if v is not None and v > 0], "float64")
    if values.size == 0:
        return []
    low, high = float(values.min()), float(values.max())
    if high <= low:
        return [low]
    for steps in ((1,), (1, 2, 5), (1, 2, 3, 5, 7)):
        ticks = [
            m * 10.0**e
            for e in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
            for m in steps
            if low <= m * 10.0**e <= high
        ]
        if len(ticks) >= 3:
            return sorted(set(ticks))
    # A narrow range: evenly spaced round values of its own scale.
    unit = 10.0 ** math.floor(math.log10(high - low))
    for scale in (unit, unit / 2, unit / 5, unit / 10):
        ticks = np.arange(math.ceil(low / scale), math.floor(high / scale) + 1) * scale
        if len(ticks) >= 3:
            break
    return [float(np.round(t, 12)) for t in ticks] or [low, high]


def _log_axis(axis, values, fixed_locator, null_locator):
    from matplotlib.ticker import FuncFormatter

    ticks = log_ticks(values)
    if not ticks:
        return
    if axis.axis_name == "y":
        axis.axes.set_yscale("log")
    axis.set_major_locator(fixed_locator(ticks))
    axis.set_minor_locator(null_locator())
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
