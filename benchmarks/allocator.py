"""What glibc's allocator costs the main job: page faults and time, with its
default 4 KB pages and with transparent huge pages.

A training or scoring step allocates temporaries larger than the 32 MB that
glibc's `malloc` keeps for reuse (a JAX step of the convergence study: 209 MB
and 45 MB), so every step maps them afresh and the kernel faults their pages
in, 4 KB at a time. `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (glibc 2.35 and
later, with transparent huge pages in `madvise` or `always` mode) backs those
mappings with 2 MB pages (`_harness.HUGE_PAGE_TUNABLE`); `scripts/main.sh` and
`scripts/test.sh` start Python with it, and the convergence study's workers
too. It changes how memory is mapped, not what is computed.

This script runs the main job (`examples/ptb_word.py`: train, score static
and one-stream, sample; `--no-dynamic` unless `--dynamic`) on a slice of the
corpus, each backend in fresh processes, with each allocator in turn —
`--rounds` times, the order swapped every round — and gives each process's
wall time, user and system CPU time (the kernel's share is the faults' cost),
minor page faults, and the training part the job reports itself:

    python benchmarks/allocator.py --data-dir ../shared/data/ptb \\
        --json benchmarks/results/allocator.json

Time it on a quiet machine (it checks); the fault counts and CPU shares do
not need one.
"""

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import _harness

ALLOCATORS = ("default", "huge-pages")


def run_job(backend, allocator, args, folder):
    """One main job in a fresh process: its wall time, CPU times, faults and
    the results JSON's training seconds."""
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    env.update(_harness.allocator_environment(huge_pages=allocator == "huge-pages"))
    results = os.path.join(folder, f"{backend}_{allocator}.json")
    command = [sys.executable, os.path.join(_harness.REPOSITORY, "examples", "ptb_word.py"),
               "--epochs", "1", "--max-tokens", str(args.max_tokens), "--verbose", "0",
               "--results-json", results]
    command += ["--data-dir", args.data_dir] if args.data_dir else ["--no-download"]
    command += [] if args.dynamic else ["--no-dynamic"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"the main job on {backend} ({allocator}) exited with status "
                           f"{done.returncode}:\n{done.stderr[-3000:]}")
    user = after.ru_utime - before.ru_utime
    system = after.ru_stime - before.ru_stime
    job = _harness.read_json(results)
    return {"allocator": allocator, "wall_s": wall, "user_s": user, "system_s": system,
            "system_share": system / (user + system) if user + system else 0.0,
            "minor_faults": after.ru_minflt - before.ru_minflt,
            "train_s": job["train_seconds"],
            "scoring_s": job["seconds"].get("static evaluation"), "phases_s": job["seconds"]}


def summary(runs):
    """Per allocator, the median of each figure over its rounds; and the
    default's wall time over the huge pages', per round."""
    found = {}
    for allocator in ALLOCATORS:
        mine = [r for r in runs if r["allocator"] == allocator]
        found[allocator] = {key: statistics.median(r[key] for r in mine)
                            for key in ("wall_s", "user_s", "system_s", "system_share",
                                        "minor_faults", "train_s", "scoring_s")}
    pairs = [(r, s) for r, s in zip(runs[0::2], runs[1::2])]
    found["default_over_huge_pages_wall"] = [
        (a if a["allocator"] == "default" else b)["wall_s"]
        / (b if a["allocator"] == "default" else a)["wall_s"] for a, b in pairs]
    return found


def main():
    parser = _harness.argument_parser(__doc__, quiet=True, data_dir="optional",
                                      backends=_harness.BACKENDS)
    parser.add_argument("--rounds", type=int, default=2,
                        help="each allocator this many times a backend, the order "
                        "swapped every round")
    parser.add_argument("--max-tokens", type=int, default=20_000,
                        help="the corpus slice the job trains and scores on")
    parser.add_argument("--dynamic", action="store_true",
                        help="the job's dynamic evaluation too (slower)")
    args = parser.parse_args()
    if args.rounds < 1 or args.max_tokens < 1:
        raise ValueError("Expected --rounds and --max-tokens of at least 1. Received: "
                         f"--rounds {args.rounds}, --max-tokens {args.max_tokens}")
    quiet = _harness.check_quiet(args.max_load_per_cpu, args.on_busy)
    backends = {}
    with tempfile.TemporaryDirectory(prefix="allocator_") as folder:
        for backend in args.backends:
            runs = []
            for round_ in range(args.rounds):
                for allocator in ALLOCATORS[::1 if round_ % 2 == 0 else -1]:
                    runs.append(dict(run_job(backend, allocator, args, folder),
                                     round=round_, load_average=_harness.load_average()))
                    print(f"{backend} {allocator}: {runs[-1]}", file=sys.stderr, flush=True)
            backends[backend] = {"runs": runs, "summary": summary(runs)}
    if args.json:
        _harness.write_json(args.json, {
            "command": _harness.command_line(__file__),
            "machine": _harness.machine(), "quiet_machine": quiet,
            "load_average_end": _harness.load_average(),
            "glibc": os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None,
            "transparent_hugepage": _harness.transparent_huge_pages(),
            "settings": vars(args), "backends": backends,
        })
    print(f"The main job (`examples/ptb_word.py`, 1 epoch, {args.max_tokens:,} tokens"
          f"{', dynamic evaluation' if args.dynamic else ''}), a fresh process each; "
          f"medians of {args.rounds} round(s).")
    print("| backend | allocator | wall (s) | training (s) | static scoring (s) "
          "| user CPU (s) | system CPU (s) "
          "| system share | minor faults | default / huge pages, wall (each round) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for backend, entry in backends.items():
        for allocator in ALLOCATORS:
            s = entry["summary"][allocator]
            ratios = entry["summary"]["default_over_huge_pages_wall"]
            print(f"| {backend} | {allocator} | {s['wall_s']:.1f} | {s['train_s']:.1f} | "
                  f"{s['scoring_s']:.1f} | "
                  f"{s['user_s']:.1f} | {s['system_s']:.1f} | {100 * s['system_share']:.0f} % | "
                  f"{s['minor_faults']:,.0f} | "
                  + (", ".join(f"{r:.2f}" for r in ratios) if allocator == "default" else "")
                  + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
