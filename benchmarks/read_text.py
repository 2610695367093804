"""Reading 100M-symbol corpora, and what the checked-once ids save afterwards.

Writes three synthetic files of the standard sizes (10⁸ bytes each, made
here: no download) and reads each in a fresh process, timing the read and
the peak memory it adds:

- `enwik8`-like (Wikipedia XML, UTF-8 in several scripts) with `load_enwik8`
  (byte level, 90M / 5M / 5M);
- `text8`-like (26 letters and the space on one line) with `load_text8`
  (character level);
- a word-level text (lines of words from a 20k-word Zipfian vocabulary),
  one file, with `load_text(path)` (word level, cut 90 / 5 / 5 % by lines).

Then, on the enwik8 corpus, the consumers that used to scan the ids again
each time (`StreamDataset` with `check_token_ids`, the id check of the
temperature search and of `DynamicEvaluator.evaluate` / the gradient
statistics, `_validation.token_ids`): their time on the corpus's own
(checked, read-only) arrays against a writable copy of the same ids, which
they must scan.

    python benchmarks/read_text.py --json benchmarks/results/read_text.json

The machine's load average is recorded with the results: the times are
wall-clock seconds on a shared machine.
"""

import os
import resource
import tempfile
import time

import _harness

SIZE = 100_000_000


def _write_files(directory, size):
    import numpy as np

    rng = np.random.default_rng(0)
    paths = {}
    pieces = [
        "<page>\n  <title>Zürich</title>\n  <id>1207</id>\n",
        "    <text xml:space=\"preserve\">'''Zürich''' is the largest city of ",
        "[[Switzerland]] ([[German language|German]]: ''Zürich''). ",
        "[[Москва|Moscow]], [[東京都|Tokyo]] and [[Αθήνα]] &amp; more. ",
        "{{cite web|url=http://example.org/|title=Naïve café}}\n",
        "== History ==\n* 1351: joins the [[Old Swiss Confederacy]]\n",
        "</text>\n</page>\n",
    ]
    encoded = [p.encode("utf-8") for p in pieces]
    choice = rng.integers(len(encoded), size=size // 40 + 10)
    data = b"".join(encoded[i] for i in choice)
    while len(data) < size:
        data += data
    paths["enwik8"] = os.path.join(directory, "enwik8")
    with open(paths["enwik8"], "wb") as f:
        f.write(data[:size])
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)
    words = [
        bytes(rng.choice(letters, int(n))) for n in rng.integers(1, 11, size=5000)
    ]
    index = rng.zipf(1.3, size=size // 4) % len(words)
    text8 = b" " + b" ".join(words[i] for i in index)
    paths["text8"] = os.path.join(directory, "text8")
    with open(paths["text8"], "wb") as f:
        f.write(text8[:size])
    vocabulary = [f"w{k}".encode() for k in range(20_000)]
    index = rng.zipf(1.2, size=size // 4) % len(vocabulary)
    lengths = rng.integers(5, 30, size=len(index) // 5)
    out, start = [], 0
    for n in lengths:
        out.append(b" ".join(vocabulary[i] for i in index[start : start + n]))
        start += n
        if start >= len(index):
            break
    text = b"\n".join(out) + b"\n"
    paths["words"] = os.path.join(directory, "words.txt")
    with open(paths["words"], "wb") as f:
        f.write(text[:size].rsplit(b"\n", 1)[0] + b"\n")
    return paths


def _memory_kb(field):
    """A `/proc/self/status` memory field (`VmRSS`, `VmHWM`) in kB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak_memory():
    """Resets the process's VmHWM (Linux: `echo 5 > /proc/self/clear_refs`)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _child(kind, path):
    """Runs in a fresh process: one read, its time and memory."""
    import numpy as np

    from keras_mogrifier import data

    # The high-water mark of resident memory is reset after the imports
    # (Keras and TensorFlow alone reach several hundred MB), so that the
    # peak below is the read's own.
    base = _memory_kb("VmRSS")
    reset = _reset_peak_memory()
    held_out = os.path.getsize(path) // 20  # 5M each of the standard 10⁸
    read = _harness.Timing()
    with read.measure():
        if kind == "enwik8":
            corpus = data.load_enwik8(path, valid_bytes=held_out, test_bytes=held_out)
        elif kind == "text8":
            corpus = data.load_text8(path, valid_characters=held_out,
                                     test_characters=held_out)
        else:
            corpus = data.load_text(path)
    seconds, cpu = read.median, read.cpu_median
    peak = _memory_kb("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux keeps ru_maxrss across execve: this is the larger of the child's
    # peak and that of the parent that wrote the files (not the read's).
    process_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = {
        "file": kind,
        "bytes": os.path.getsize(path),
        "level": corpus.level,
        "tokens": {s: int(len(corpus[s])) for s in corpus.splits},
        "vocabulary_size": len(corpus.vocabulary),
        "dtype": str(corpus.train.dtype),
        "read_seconds": seconds,
        "read_cpu_seconds": cpu,
        "rss_mb_before_the_read": base / 1024,
        "peak_rss_mb_during_the_read": peak / 1024,
        "added_peak_mb": (peak - base) / 1024,
        "peak_was_reset_after_the_imports": reset,
        "process_peak_rss_mb_imports_included": process_peak / 1024,
    }
    if kind == "enwik8":
        result["consumers"] = _consumers(corpus, np)
    return result


def _consumers(corpus, np):
    from keras_mogrifier import _validation
    from keras_mogrifier.data import StreamDataset

    size = len(corpus.vocabulary)

    def timed(fn):
        return _harness.time_call(fn, repeats=3).best

    out = {}
    for label, train, valid in (
        ("corpus arrays (checked once)", corpus.train, corpus.valid),
        ("writable copies (scanned)", corpus.train.copy(), corpus.valid.copy()),
    ):
        out[label] = {
            "StreamDataset(train, 128, 500) + check_token_ids": timed(
                lambda: StreamDataset(train, 128, 500).check_token_ids(size)
            ),
            "token_ids(valid) (temperature search, evaluate)": timed(
                lambda: _validation.token_ids("ids", valid, size, ndim=1)
            ),
            "token_ids(train) (gradient statistics)": timed(
                lambda: _validation.token_ids("data", train[None], size)
            ),
        }
    return out


def main(argv=None):
    parser = _harness.argument_parser(__doc__, quiet=True)
    parser.add_argument("--size", type=int, default=SIZE, help="bytes per file")
    args = parser.parse_args(argv)
    quiet = _harness.check_quiet(args.max_load_per_cpu, args.on_busy)
    results = {
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_before": quiet["load_average"],
        },
        "quiet_machine": quiet,
        "reads": [],
    }
    with tempfile.TemporaryDirectory() as directory:
        start = time.perf_counter()
        paths = _write_files(directory, args.size)
        results["machine"]["seconds_to_write_the_files"] = time.perf_counter() - start
        for kind, path in paths.items():
            result = _harness.run_in_backend(
                _child, kind, path, backend=os.environ.get("KERAS_BACKEND", "tensorflow"),
                env={"TF_CPP_MIN_LOG_LEVEL": "3"}, capture_output=True,
            )
            results["reads"].append(result)
            print(
                f"{kind}: {result['bytes']:,} bytes, {result['level']} level, "
                f"{sum(result['tokens'].values()):,} tokens ({result['dtype']}), "
                f"vocabulary {result['vocabulary_size']:,}: read in "
                f"{result['read_seconds']:.1f} s ({result['read_cpu_seconds']:.1f} s of CPU), peak memory +{result['added_peak_mb']:.0f} MB "
                f"(resident {result['peak_rss_mb_during_the_read']:.0f} MB at the peak, imports included)",
                flush=True,
            )
            for label, timings in result.get("consumers", {}).items():
                print(f"  {label}:")
                for what, seconds in timings.items():
                    print(f"    {what}: {1000 * seconds:.1f} ms")
    results["machine"]["load_average_after"] = _harness.load_average()
    print(f"load average before / after: {results['machine']['load_average_before']} / "
          f"{results['machine']['load_average_after']} on {os.cpu_count()} CPUs")
    if args.json:
        _harness.write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
