"""The picture of a run: learning curves and dynamic evaluation along the text."""

import os

import numpy as np


def plot_run(results, path, window=None):
    """Draws `results` of `run_experiment` to the PNG file `path`.

    Left: training and validation perplexity per epoch. Right (when the run
    has dynamic evaluation): the loss of static and of dynamic evaluation
    along the test stream, as a moving average over `window` tokens (default:
    a twentieth of the stream, at least 50).

    Needs matplotlib (`pip install "keras-mogrifier[plot]"`).

    Returns:
        `path`.
    """
    try:
        import matplotlib
    except ImportError as error:  # pragma: no cover - the extra is installed in tests
        raise ImportError(
            "Expected matplotlib for the plot: pip install 'keras-mogrifier[plot]'"
        ) from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    from matplotlib.ticker import ScalarFormatter

    curves = results.get("test_token_losses")
    panels = 2 if curves else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 3.6), squeeze=False)
    ax = axes[0][0]
    train = results.get("train_perplexity_curve") or []
    valid = results.get("valid_perplexity_curve") or []
    first = results.get("initial_epoch", 0) + 1
    if train:
        ax.plot(range(first, first + len(train)), train, "o-", label="training")
    if valid:
        ax.plot(range(first, first + len(valid)), valid, "o-", label="validation")
    ax.set_xlabel("epoch")
    ax.set_ylabel("perplexity")
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.set_title(f"{results.get('preset', '')} preset, {results.get('corpus_source', '')} corpus")
    ax.legend()
    if curves:
        ax = axes[0][1]
        static = np.asarray(curves["static"], "float64").ravel()
        dynamic = np.asarray(curves["dynamic"], "float64").ravel()
        width = window or max(50, len(static) // 20)
        kernel = np.ones(width) / width
        x = np.arange(width, len(static) + 1)
        ax.plot(x, np.convolve(static, kernel, "valid"), label="static")
        ax.plot(x, np.convolve(dynamic, kernel, "valid"), label="dynamic")
        ax.set_xlabel("tokens of the test stream")
        ax.set_ylabel(f"loss (nats), mean of {width} tokens")
        ax.set_title("dynamic evaluation along the test text")
        ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
