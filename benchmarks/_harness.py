"""What every benchmark script shares: set-up, timing, the quiet-machine check,
the JSON file, and a fresh process per Keras backend.

The scripts beside this file import it as `import _harness` (a script's own
folder is first on `sys.path`; a module that tests load by path puts it there
itself). It imports neither Keras nor NumPy, so a script can set the
environment with it before Keras is imported:

```python
import _harness

_harness.environment("jax")  # KERAS_BACKEND and TF_CPP_MIN_LOG_LEVEL, unless set

import keras  # noqa: E402
```

The house rules it serves: speed and memory are reported
as ratios against a reference measured in the same process, or against a
measured physical floor; timings are taken on a quiet machine, and the JSON
says how quiet it was (`check_quiet`); long studies write each finished unit
to their JSON at once (`write_json`, `merge_json`, `Record`) and resume.
"""

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
BACKENDS = ("tensorflow", "jax", "torch")
# The quiet-machine check's default limit, and what a busy machine may do.
DEFAULT_MAX_LOAD_PER_CPU = 0.25
ON_BUSY = ("warn", "refuse", "ignore")

# The clocks `Timing` reads (module attributes, so that a test can stand in).
wall_clock = time.perf_counter
cpu_clock = time.process_time


# === Environment and command line ===


def environment(backend="tensorflow", log_level="2"):
    """Sets a benchmark process's environment defaults, before Keras is imported.

    Args:
        backend: str. `KERAS_BACKEND` unless it is set already. Defaults to
            `"tensorflow"`.
        log_level: str. `TF_CPP_MIN_LOG_LEVEL` unless it is set already
            (`"2"` hides TensorFlow's information and warning lines).
            Defaults to `"2"`.
    """
    os.environ.setdefault("KERAS_BACKEND", backend)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", str(log_level))


def argument_parser(doc, json_flag=True, json_default=None, json_required=False,
                    data_dir=None, backends=None, quiet=False, **kwargs):
    """An `argparse.ArgumentParser` with the flags the scripts share.

    Args:
        doc: str. The script's docstring; its first line is the description.
        json_flag: bool. Whether to add `--json` (the output file). Defaults to `True`.
        json_default: str or `None`. `--json`'s default. Defaults to `None`
            (no file unless asked).
        json_required: bool. Whether `--json` must be given. Defaults to `False`.
        data_dir: `None`, `"optional"` or `"required"`. Whether to add
            `--data-dir` (a corpus folder, `ptb.{train,valid,test}.txt[.gz]`).
            Defaults to `None` (no flag).
        backends: tuple of str or `None`. Adds `--backends` with these as the
            default (any of `BACKENDS` may be chosen). Defaults to `None` (no flag).
        quiet: bool. Whether to add the quiet-machine flags (`add_quiet_arguments`).
            Defaults to `False`.
        **kwargs: more arguments of `argparse.ArgumentParser`.

    Returns:
        The parser; the script adds its own flags.
    """
    parser = argparse.ArgumentParser(description=doc.splitlines()[0], **kwargs)
    if data_dir is not None:
        if data_dir not in ("optional", "required"):
            raise ValueError("Expected data_dir to be None, 'optional' or 'required'. "
                             f"Received: data_dir={data_dir!r}")
        parser.add_argument("--data-dir", required=data_dir == "required",
                            help="corpus folder (ptb.{train,valid,test}.txt[.gz])")
    if backends is not None:
        parser.add_argument("--backends", nargs="+", default=list(backends),
                            choices=BACKENDS, help="each in its own process, in turn")
    if json_flag:
        parser.add_argument("--json", default=json_default, required=json_required,
                            help="write the results here")
    if quiet:
        add_quiet_arguments(parser)
    return parser


def add_quiet_arguments(parser):
    """Adds `--max-load-per-cpu` and `--on-busy`, the arguments of `check_quiet`."""
    parser.add_argument("--max-load-per-cpu", type=float, default=DEFAULT_MAX_LOAD_PER_CPU,
                        help="the 1-minute load average per usable CPU up to which the "
                             "machine counts as quiet")
    parser.add_argument("--on-busy", choices=ON_BUSY, default="warn",
                        help="what to do when the machine is not quiet (it is recorded "
                             "in the JSON either way)")


def command_line(script, argv=None, backend=None):
    """How a script was run, for its JSON: `python benchmarks/x.py --flag value`.

    Args:
        script: str. The script's path (`__file__`); shown relative to the
            repository when it lies inside it.
        argv: list of str or `None`. Its arguments. Defaults to `None`
            (`sys.argv[1:]`).
        backend: str or `None`. A backend to show as `KERAS_BACKEND=...`
            before the command. Defaults to `None`.
    """
    path = os.path.abspath(script)
    shown = os.path.relpath(path, REPOSITORY) if path.startswith(REPOSITORY + os.sep) \
        else os.path.basename(path)
    argv = sys.argv[1:] if argv is None else argv
    command = " ".join(["python", shown] + [shlex.quote(str(a)) for a in argv])
    return f"KERAS_BACKEND={backend} {command}" if backend else command


# A process started with this variable set ("0", or "0,1") runs on those CPU
# cores only: `pin_to_cores` applies it when this module is imported, before
# a backend creates its thread pools (they size themselves to the cores a
# process may use). Workers side by side on a small machine each given a
# core of their own do not preempt each other's threads
# (`convergence_cost.py` measures what that buys; `convergence.py` gives each
# `--jobs` worker a core of its own while there are free ones).
CORES_VARIABLE = "KERAS_MOGRIFIER_BENCHMARK_CORES"


def parse_cores(value):
    """The set of CPU cores a `CORES_VARIABLE` value names ("0", "0,1")."""
    try:
        cores = {int(part) for part in str(value).split(",")}
    except ValueError:
        cores = set()
    if not cores or min(cores) < 0:
        raise ValueError(
            f"Expected {CORES_VARIABLE} to name CPU cores as non-negative integers "
            f"separated by commas (\"0\" or \"0,1\"). Received: {value!r}"
        )
    return cores


def pin_to_cores(value=None):
    """Runs this process (and the threads it starts from now on) on the CPU
    cores `value` names; by default those of `CORES_VARIABLE`, if it is set.
    Returns the cores it pinned to, or `None` (nothing set, or a platform
    without `os.sched_setaffinity`).

    Raises:
        ValueError: `value` names no cores, or cores this process may not use.
    """
    value = os.environ.get(CORES_VARIABLE) if value is None else value
    if not value or not hasattr(os, "sched_setaffinity"):
        return None
    cores = parse_cores(value)
    allowed = os.sched_getaffinity(0)
    if not cores <= allowed:
        raise ValueError(
            f"Expected {CORES_VARIABLE} to name cores this process may use "
            f"({sorted(allowed)}). Received: {value!r}"
        )
    os.sched_setaffinity(0, cores)
    return cores


def own_cores():
    """The cores this process may run on, sorted, to give to workers one
    each; none where the platform cannot pin (no `os.sched_setaffinity`)."""
    if not hasattr(os, "sched_setaffinity"):
        return []
    return sorted(os.sched_getaffinity(0))


def free_core(taken):
    """A core of `own_cores()` that no worker in `taken` (the cores given to
    the workers still running) has, or `None` when every core is taken (then
    a further worker shares them all) or the platform cannot pin."""
    free = [core for core in own_cores() if core not in taken]
    return free[0] if free else None


# `XLA_FLAGS` that ask XLA for one CPU thread, and which it does not follow
# (`one_core_environment`); the convergence study's workers set them, and
# `convergence_cost.py` times the study's work with them.
XLA_ONE_THREAD_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


# glibc's tunable that backs the allocator's own mappings with transparent
# huge pages (glibc 2.35 and later; an older glibc, or another C library,
# ignores it). A JAX training step on CPU allocates its largest temporaries
# (the study's step: 209 MB and 45 MB, the logits' size) above the 32 MB
# that glibc's `malloc` keeps for reuse, so each step maps them afresh and
# faults their 4 KB pages in one by one: 28 % of a study worker's time in
# the kernel, ~67,600 page faults a second (`/proc`, `strace`, 2026-12-02).
# With it, 2 MB pages: `convergence_cost.py --allocator-rounds` measures the
# step both ways. It changes how memory is mapped, not what is computed.
HUGE_PAGE_TUNABLE = "glibc.malloc.hugetlb=1"
TUNABLES_VARIABLE = "GLIBC_TUNABLES"


def allocator_environment(huge_pages=True, environ=None):
    """The `GLIBC_TUNABLES` entry that starts a process with glibc's
    allocator on transparent huge pages (`HUGE_PAGE_TUNABLE`), or with
    `huge_pages=False` on its default 4 KB pages; either way keeping the
    other tunables `environ` (default: this process's) sets. A
    `glibc.malloc.hugetlb` that `environ` sets itself is kept when
    `huge_pages` is true.

    glibc reads it when a process starts, so it serves the processes a
    script starts, not the script itself. Returns a dict of one entry.
    """
    environ = os.environ if environ is None else environ
    items = [item for item in environ.get(TUNABLES_VARIABLE, "").split(":") if item]
    mine = [item for item in items if item.split("=", 1)[0] == "glibc.malloc.hugetlb"]
    items = [item for item in items if item not in mine]
    if huge_pages:
        items += mine or [HUGE_PAGE_TUNABLE]
    return {TUNABLES_VARIABLE: ":".join(items)}


THP_MODE_PATH = "/sys/kernel/mm/transparent_hugepage/enabled"


def transparent_huge_pages(path=THP_MODE_PATH):
    """The kernel's transparent huge page mode line, e.g.
    `"always [madvise] never"` (the bracketed mode is in force; glibc's
    `glibc.malloc.hugetlb=1` needs `madvise` or `always`), or `None` where
    the kernel does not say (another OS, no THP support)."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def glibc_version():
    """The running glibc's `(major, minor)`, or `()` where it is not glibc
    (its `hugetlb` tunable needs 2.35 or later)."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        return tuple(int(part) for part in version.split(".")[:2])
    except (AttributeError, ValueError, OSError):
        return ()


def one_core_environment():
    """The environment entries that start a benchmark process on one core of
    this process's: `{CORES_VARIABLE: "<core>"}`, or `{}` where the platform
    cannot pin.

    On CPU this is how a JAX process runs one thread: XLA sizes its thread
    pool to the cores the process may use, and `XLA_ONE_THREAD_FLAGS` do not
    shrink it — with them, two pool threads shared a process's work on
    2 cores (JAX 0.10.2, per-thread CPU time, 2026-12-02; the harness test
    `test_one_core_is_how_a_jax_process_runs_one_thread` checks both).
    """
    cores = own_cores()
    return {CORES_VARIABLE: str(cores[0])} if cores else {}


def run_on_one_core():
    """Pins this process to one core (`one_core_environment`) unless
    `CORES_VARIABLE` already chose its cores; call it before a backend starts.
    Returns the cores this process runs on, or `None` where it cannot pin."""
    if os.environ.get(CORES_VARIABLE):
        return pin_to_cores()
    value = one_core_environment().get(CORES_VARIABLE)
    if value is None:
        return None
    os.environ[CORES_VARIABLE] = value  # and the processes it starts
    return pin_to_cores(value)


def usable_cpus():
    """The CPUs this process may run on (its affinity), else the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine():
    """What the numbers were measured on: CPUs, processor, platform, Python, host."""
    processor = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            processor = next((line.split(":", 1)[1].strip() for line in f
                              if line.startswith("model name")), processor)
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpus_usable": usable_cpus(), "processor": processor,
            "platform": platform.platform(), "python": platform.python_version(),
            "host": platform.node()}


def versions():
    """Keras's and the active backend's versions, and the backend's devices.

    Imports Keras (call it after `environment`).
    """
    import keras

    backend = keras.backend.backend()
    found = {"keras": keras.__version__, "python": platform.python_version(),
             backend: __import__(backend).__version__}
    if backend == "jax":
        import jax

        found["devices"] = [str(d) for d in jax.devices()]
        found["jax_default_matmul_precision"] = str(jax.config.jax_default_matmul_precision)
    elif backend == "torch":
        import torch

        found["cuda"] = torch.version.cuda
        found["cudnn"] = torch.backends.cudnn.version()
        found["float32_matmul_precision"] = torch.get_float32_matmul_precision()
        found["cudnn_allow_tf32"] = torch.backends.cudnn.allow_tf32
        found["devices"] = (
            [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            if torch.cuda.is_available() else ["cpu"]
        )
    return found


def log(*parts):
    """Prints `parts` after the time of day (`HH:MM:SS`), flushed: a long run's log line."""
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


# === The quiet-machine check ===


def load_average():
    """The 1-, 5- and 15-minute load averages as a list, or `None` where unknown."""
    try:
        return list(os.getloadavg())
    except (AttributeError, OSError):
        return None


def is_quiet(load, cpus, max_load_per_cpu=DEFAULT_MAX_LOAD_PER_CPU):
    """Whether a 1-minute load average `load` on `cpus` CPUs counts as quiet.

    Quiet is at most `max_load_per_cpu` runnable processes per CPU on average
    over the last minute. An unknown load (`None`) is not quiet: nothing
    says it is.
    """
    if load is None:
        return False
    return load / max(1, cpus) <= max_load_per_cpu


def check_quiet(max_load_per_cpu=DEFAULT_MAX_LOAD_PER_CPU, on_busy="warn", load=None,
                cpus=None):
    """Checks that the machine is quiet enough to time on, and records it.

    Args:
        max_load_per_cpu: float. The 1-minute load average per usable CPU up
            to which the machine is quiet (`is_quiet`). Defaults to `0.25`.
        on_busy: str. What a busy machine does: `"warn"` (a line on stderr),
            `"refuse"` (`SystemExit`) or `"ignore"`. Defaults to `"warn"`.
        load: list of float or `None`. The load averages; defaults to `None`
            (`load_average()` now).
        cpus: int or `None`. Usable CPUs; defaults to `None` (`usable_cpus()`).

    Returns:
        The record for the script's JSON: `load_average`, `cpus`,
        `max_load_per_cpu`, `quiet` and `on_busy`.
    """
    if on_busy not in ON_BUSY:
        raise ValueError(f"Expected on_busy to be one of {ON_BUSY}. Received: "
                         f"on_busy={on_busy!r}")
    load = load_average() if load is None else list(load)
    cpus = usable_cpus() if cpus is None else cpus
    quiet = is_quiet(load[0] if load else None, cpus, max_load_per_cpu)
    record = {"load_average": load, "cpus": cpus, "max_load_per_cpu": max_load_per_cpu,
              "quiet": quiet, "on_busy": on_busy}
    if not quiet and on_busy != "ignore":
        message = (f"the machine is not quiet: load average {load} on {cpus} CPU(s), "
                   f"above {max_load_per_cpu} per CPU; timings taken now are noise")
        if on_busy == "refuse":
            raise SystemExit(f"Refusing to time: {message} (--on-busy warn runs anyway).")
        print(f"warning: {message} (recorded in the JSON).", file=sys.stderr, flush=True)
    return record


# === Timing ===


class Timing:
    """Wall-clock and process-CPU seconds of repeated calls, and their summary.

    The CPU time is the process's (`time.process_time`: every thread, spinning
    ones included); on a loaded machine the wall time also counts the time the
    process waited for a core, the CPU time much less so.

    Args:
        wall: list of float. Wall-clock seconds of each call. Defaults to none.
        cpu: list of float. Process CPU seconds of each call. Defaults to none.

    Example:

    >>> timing = Timing(wall=[0.3, 0.1, 0.2])
    >>> timing.median, round(timing.spread, 3), timing.best
    (0.2, 0.2, 0.1)
    >>> timing.per(100)  # ms per item of 100
    2.0
    """

    def __init__(self, wall=(), cpu=()):
        self.wall = list(wall)
        self.cpu = list(cpu)

    @contextlib.contextmanager
    def measure(self, sync=None):
        """Times the `with` block as one more call (`sync()` before and after:
        waits for a device). A block that raises adds nothing."""
        if sync is not None:
            sync()
        wall, cpu = wall_clock(), cpu_clock()
        yield self
        if sync is not None:
            sync()
        self.wall.append(wall_clock() - wall)
        self.cpu.append(cpu_clock() - cpu)

    @property
    def median(self):
        """The median wall-clock seconds of a call."""
        return statistics.median(self.wall)

    @property
    def cpu_median(self):
        """The median CPU seconds of a call."""
        return statistics.median(self.cpu)

    @property
    def best(self):
        """The fastest call's wall-clock seconds (the least disturbed)."""
        return min(self.wall)

    @property
    def spread(self):
        """Slowest minus fastest call, wall-clock seconds."""
        return max(self.wall) - min(self.wall)

    @property
    def relative_spread(self):
        """`spread / median`: 0.1 is calls within 10 % of the median's size."""
        return self.spread / self.median

    def per(self, count, scale=1000.0):
        """The median wall time per item of `count` (milliseconds by default)."""
        return scale * self.median / count

    def cpu_per(self, count, scale=1000.0):
        """The median CPU time per item of `count` (milliseconds by default)."""
        return scale * self.cpu_median / count

    def all_per(self, count, scale=1000.0):
        """Every call's wall time per item of `count` (milliseconds by default)."""
        return [scale * t / count for t in self.wall]


def time_call(function, repeats=3, warmup=0, sync=None):
    """Times `repeats` calls of `function()` after `warmup` untimed ones.

    Args:
        function: a callable without arguments.
        repeats: int. Timed calls. Defaults to `3`.
        warmup: int. Untimed calls first (tracing, compilation, caches).
            Defaults to `0`.
        sync: a callable or `None`. Called before and after each timed call
            (e.g. `torch.cuda.synchronize`). Defaults to `None`.

    Returns:
        A `Timing` of the timed calls.
    """
    for _ in range(warmup):
        function()
    timing = Timing()
    for _ in range(repeats):
        with timing.measure(sync):
            function()
    return timing


def time_interleaved(functions, rounds=3, repeats=1, warmup=0, sync=None):
    """Times several functions in turn, round after round, in this process.

    Interleaving gives each function the same share of whatever else the
    machine is doing, so their ratios mean something where their absolute
    times do not.

    Args:
        functions: dict of name to a callable without arguments.
        rounds: int. Rounds; each times every function. Defaults to `3`.
        repeats: int. Timed calls of a function per round. Defaults to `1`.
        warmup: int. Untimed calls of each function first, in order.
            Defaults to `0`.
        sync: a callable or `None`. See `time_call`. Defaults to `None`.

    Returns:
        A dict of name to `Timing` (`rounds × repeats` calls each).
    """
    for function in functions.values():
        for _ in range(warmup):
            function()
    timings = {name: Timing() for name in functions}
    for _ in range(rounds):
        for name, function in functions.items():
            for _ in range(repeats):
                with timings[name].measure(sync):
                    function()
    return timings


def peak_memory_mib():
    """The process's peak resident memory so far, MiB (`ru_maxrss`, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def memory_mib():
    """The process's resident memory now, MiB (`/proc/self/statm`, Linux)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


# === The JSON file ===

_MISSING = object()


def write_json(path, data, indent=2, **kwargs):
    """Writes `data` as JSON to `path`, atomically.

    The text goes to a temporary file in the same folder, which then replaces
    `path` (`os.replace`): a reader, or a run stopped half-way, sees the old
    file or the new one, never a part. Missing folders are created.

    Args:
        path: str. The file.
        data: what `json.dump` can write.
        indent: int or `None`. Defaults to `2`.
        **kwargs: more arguments of `json.dump` (e.g. `default=str`).
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(
        dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as f:
            json.dump(data, f, indent=indent, **kwargs)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp's file is private
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def read_json(path, default=_MISSING):
    """The JSON at `path`; `default` if there is no such file (when given)."""
    if default is not _MISSING and not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


def merge_json(path, keys, value, append=False, indent=2):
    """Puts one finished unit into the JSON at `path` and writes it at once.

    Earlier units stay as they are: the file is read (or starts as `{}`),
    `value` is set at the nested `keys` (dicts are created on the way), and
    the whole is written back with `write_json`.

    Args:
        path: str. The file.
        keys: str or list of str. Where the value goes: `["part_a", "jax", "rows"]`
            is `data["part_a"]["jax"]["rows"]`.
        value: the unit, JSON-serialisable.
        append: bool. Append `value` to the list at `keys` (created empty if
            missing) instead of setting it. Defaults to `False`.
        indent: int or `None`. See `write_json`. Defaults to `2`.

    Returns:
        The file's data as written.
    """
    keys = [keys] if isinstance(keys, str) else list(keys)
    data = read_json(path, default={})
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    if append:
        node.setdefault(keys[-1], []).append(value)
    else:
        node[keys[-1]] = value
    write_json(path, data, indent=indent)
    return data


class Record:
    """A long study's JSON: its settings, and every finished unit saved at once.

    A new record starts as `{"settings": settings, **fields}`. With `resume`
    and the file there, the file is read instead, and its settings must be
    the ones given: a study resumed with other settings would mix two
    studies in one file.

    Args:
        path: str. The JSON file.
        settings: dict. What the study's numbers depend on (JSON-serialisable).
        resume: bool. Continue the study in `path` if it exists. Defaults to `False`.
        ignore: tuple of str. Settings that may differ on resuming (e.g. the
            backend). Defaults to `()`.
        what: str. What the file holds, for the error message. Defaults to
            `"study"`.
        indent: int or `None`. See `write_json`. Defaults to `1`.
        **fields: the other top-level entries of a new record (e.g. `rows=[]`).

    Example:

    ```python
    record = Record("out.json", {"epochs": 5}, resume=True, units={})
    if "lstm" not in record.data["units"]:
        record.data["units"]["lstm"] = train("lstm")
        record.save()
    ```
    """

    def __init__(self, path, settings, resume=False, ignore=(), what="study", indent=1,
                 **fields):
        self.path = path
        self.indent = indent
        if resume and os.path.exists(path):
            self.data = read_json(path)
            changed = changed_settings(self.data["settings"], settings, ignore)
            if changed:
                raise ValueError(
                    f"Expected the settings recorded in {path} to resume that "
                    f"{what}. Received different values for: {changed}"
                )
        else:
            self.data = {"settings": settings, **fields}

    def save(self):
        """Writes the record (`write_json`)."""
        write_json(self.path, self.data, indent=self.indent)


def changed_settings(recorded, current, ignore=()):
    """The sorted names whose values differ between two settings dicts, as
    JSON sees them (a tuple equals a list), `ignore`d names left out."""
    current = json.loads(json.dumps(current))
    names = (set(recorded) | set(current)) - set(ignore)
    return sorted(k for k in names if recorded.get(k) != current.get(k))


# === A fresh process per backend ===


class WorkerError(RuntimeError):
    """A worker process failed; `returncode` is its exit status, `output` what
    it printed when its output was captured."""

    def __init__(self, message, returncode, output=""):
        super().__init__(message)
        self.returncode = returncode
        self.output = output


@contextlib.contextmanager
def busy_processes(count):
    """`count` busy processes (a pure Python spin, one core each) while the
    `with` block runs: what a benchmark costs on a machine that is not quiet."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(count)]
    try:
        yield spinning
    finally:
        for process in spinning:
            process.kill()
            process.wait()


# The worker's entry: the harness's folder on the path, then `_child`.
_CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); import _harness; "
          "_harness._child(*sys.argv[2:])")


def run_in_backend(function, *args, backend=None, env=None, timeout=None, busy=0,
                   capture_output=False):
    """Calls `function(*args)` in a fresh Python process and returns its result.

    The process imports the file that defines `function` under another name
    than `__main__` (its `if __name__ == "__main__":` block does not run),
    with that file's folder first on `sys.path`, and calls the function;
    the arguments and the result travel as JSON. A fresh process per call is
    what makes a backend's import, its thread pools and its peak memory the
    call's own.

    Args:
        function: a function defined at the top level of a Python file.
        *args: its arguments: JSON-serialisable values, or
            `argparse.Namespace`s of them (rebuilt as namespaces).
        backend: str or `None`. The process's `KERAS_BACKEND`. Defaults to
            `None` (this process's environment).
        env: dict or `None`. More environment variables. Defaults to `None`.
        timeout: float or `None`. Seconds before the process is killed and
            `subprocess.TimeoutExpired` raised. Defaults to `None`.
        busy: int. Busy processes beside it (`busy_processes`). Defaults to `0`.
        capture_output: bool. Keep the process's output rather than showing
            it (given in the `WorkerError` if it fails). Defaults to `False`.

    Returns:
        What `function` returned, through JSON.

    Raises:
        WorkerError: the process exited with a non-zero status.
    """
    script = os.path.abspath(sys.modules[function.__module__].__file__)
    environment_ = dict(os.environ, **(env or {}))
    if backend is not None:
        environment_["KERAS_BACKEND"] = backend
    with tempfile.TemporaryDirectory(prefix="benchmark_worker_") as folder:
        arguments = os.path.join(folder, "arguments.json")
        result = os.path.join(folder, "result.json")
        write_json(arguments, [_encode(a) for a in args], indent=None)
        command = [sys.executable, "-c", _CHILD, HERE, script, function.__qualname__,
                   arguments, result]
        with busy_processes(busy):
            done = subprocess.run(command, env=environment_, timeout=timeout,
                                  capture_output=capture_output, text=True)
        if done.returncode != 0:
            output = (done.stdout or "") + (done.stderr or "")
            raise WorkerError(
                f"{function.__qualname__} of {os.path.basename(script)} on "
                f"{environment_.get('KERAS_BACKEND')} exited with status "
                f"{done.returncode}" + (f":\n{output[-3000:]}" if output else ""),
                done.returncode, output,
            )
        return read_json(result)


def run_each_backend(function, backends, *args, **kwargs):
    """`run_in_backend` once per backend, one after the other, each result
    with the load average before and after it.

    Returns:
        `{backend: {"load_average_before", "load_average_after", "rows"}}`,
        `rows` being what `function(*args)` returned on that backend.
    """
    results = {}
    for backend in backends:
        before = load_average()
        rows = run_in_backend(function, *args, backend=backend, **kwargs)
        results[backend] = {"load_average_before": before,
                            "load_average_after": load_average(), "rows": rows}
    return results


def _encode(value):
    if isinstance(value, argparse.Namespace):
        return {"__namespace__": vars(value)}
    return value


def _decode(value):
    if isinstance(value, dict) and set(value) == {"__namespace__"}:
        return argparse.Namespace(**value["__namespace__"])
    return value


def _child(script, name, arguments, result):
    """The worker process of `run_in_backend`."""
    sys.path.insert(0, os.path.dirname(script))
    module_name = "_worker_" + os.path.splitext(os.path.basename(script))[0]
    spec = importlib.util.spec_from_file_location(module_name, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    function = module
    for part in name.split("."):
        function = getattr(function, part)
    value = function(*[_decode(a) for a in read_json(arguments)])
    write_json(result, value, indent=None)


pin_to_cores()
