"""benchmarks/_harness.py: the timing loop's arithmetic and order, the quiet
check's decision, the atomic JSON writer, the merge of finished units, a
resumed record's settings, and the fresh process per backend. NumPy-free and
Keras-free: the harness imports neither."""

import argparse
import json
import os
import sys
import textwrap

import pytest

from testing import load_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


HARNESS = load_module(os.path.join(ROOT, "benchmarks", "_harness.py"), "_harness")


@pytest.fixture(scope="module")
def harness():
    return HARNESS


@pytest.fixture
def clocks(harness, monkeypatch):
    """Scripted clocks: each call of `tick(wall, cpu)` is the next call's length."""
    now = {"wall": 100.0, "cpu": 10.0}
    lengths = []

    def wall_clock():
        return now["wall"]

    def cpu_clock():
        return now["cpu"]

    def tick():
        wall, cpu = lengths.pop(0)
        now["wall"] += wall
        now["cpu"] += cpu

    monkeypatch.setattr(harness, "wall_clock", wall_clock)
    monkeypatch.setattr(harness, "cpu_clock", cpu_clock)
    return lengths, tick


# === Timing ===


def test_median_spread_and_per_item_against_a_hand_computation(harness):
    timing = harness.Timing(wall=[0.4, 0.1, 0.3, 1.0], cpu=[0.2, 0.1, 0.3, 0.5])
    # Sorted 0.1, 0.3, 0.4, 1.0: the median is (0.3 + 0.4) / 2.
    assert timing.median == pytest.approx(0.35)
    assert timing.cpu_median == pytest.approx(0.25)
    assert timing.best == 0.1
    assert timing.spread == pytest.approx(0.9)
    assert timing.relative_spread == pytest.approx(0.9 / 0.35)
    assert timing.per(70) == pytest.approx(1000 * 0.35 / 70)  # ms per item
    assert timing.cpu_per(5, scale=1.0) == pytest.approx(0.05)
    assert timing.all_per(2) == pytest.approx([200.0, 50.0, 150.0, 500.0])
    assert harness.Timing(wall=[0.3, 0.1, 0.2]).median == 0.2


def test_time_call_warms_up_untimed_then_times_wall_and_cpu(harness, clocks):
    lengths, tick = clocks
    calls = []

    def function():
        calls.append(len(calls))
        tick()

    # Two warm-up calls (5 s and 4 s: never timed), then three timed ones.
    lengths.extend([(5.0, 5.0), (4.0, 4.0), (0.3, 0.1), (0.1, 0.1), (0.2, 0.05)])
    timing = harness.time_call(function, repeats=3, warmup=2)
    assert len(calls) == 5
    assert timing.wall == pytest.approx([0.3, 0.1, 0.2])
    assert timing.cpu == pytest.approx([0.1, 0.1, 0.05])
    assert timing.median == pytest.approx(0.2)


def test_measure_syncs_around_the_block_and_a_failed_block_adds_nothing(harness, clocks):
    lengths, tick = clocks
    events = []
    timing = harness.Timing()
    lengths.append((2.0, 1.0))
    with timing.measure(sync=lambda: events.append("sync")):
        events.append("work")
        tick()
    assert events == ["sync", "work", "sync"]
    assert timing.wall == [2.0] and timing.cpu == [1.0]
    with pytest.raises(RuntimeError):
        with timing.measure():
            raise RuntimeError("a failed call")
    assert timing.wall == [2.0]


def test_time_interleaved_takes_turns_round_after_round(harness):
    order = []
    functions = {name: (lambda n=name: order.append(n)) for name in ("a", "b")}
    timings = harness.time_interleaved(functions, rounds=2, repeats=2, warmup=1)
    assert order == ["a", "b"] + ["a", "a", "b", "b"] * 2
    assert [len(timings[n].wall) for n in "ab"] == [4, 4]


# === The quiet-machine check ===


@pytest.mark.parametrize("load, cpus, quiet", [
    (0.4, 2, True),  # 0.2 per CPU
    (0.5, 2, True),  # 0.25 per CPU: the limit itself is quiet
    (0.6, 2, False),
    (0.3, 1, False),
    (None, 2, False),  # unknown is not quiet
])
def test_is_quiet_compares_the_load_per_cpu_with_the_limit(harness, load, cpus, quiet):
    assert harness.is_quiet(load, cpus, max_load_per_cpu=0.25) is quiet


def test_check_quiet_records_the_load_and_warns_refuses_or_ignores(harness, capsys):
    quiet = harness.check_quiet(0.25, "refuse", load=[0.1, 0.2, 0.3], cpus=2)
    assert quiet == {"load_average": [0.1, 0.2, 0.3], "cpus": 2, "max_load_per_cpu": 0.25,
                     "quiet": True, "on_busy": "refuse"}
    assert capsys.readouterr().err == ""
    busy = harness.check_quiet(0.25, "warn", load=[3.0, 2.0, 1.0], cpus=2)
    assert busy["quiet"] is False and busy["load_average"] == [3.0, 2.0, 1.0]
    assert "not quiet" in capsys.readouterr().err
    harness.check_quiet(0.25, "ignore", load=[3.0, 2.0, 1.0], cpus=2)
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit, match="Refusing to time"):
        harness.check_quiet(0.25, "refuse", load=[3.0, 2.0, 1.0], cpus=2)
    with pytest.raises(ValueError, match="on_busy"):
        harness.check_quiet(0.25, "shrug", load=[0.0, 0.0, 0.0], cpus=2)


def test_the_quiet_flags_reach_check_quiet(harness):
    parser = harness.argument_parser("A benchmark.\n\nMore.", data_dir="required",
                                     backends=("jax",), quiet=True)
    args = parser.parse_args(["--data-dir", "d", "--on-busy", "refuse"])
    assert (args.data_dir, args.backends, args.json) == ("d", ["jax"], None)
    assert (args.max_load_per_cpu, args.on_busy) == (0.25, "refuse")
    assert parser.description == "A benchmark."
    with pytest.raises(SystemExit):
        parser.parse_args(["--data-dir", "d", "--on-busy", "shrug"])


def test_command_line_quotes_and_names_the_backend(harness):
    script = os.path.join(ROOT, "benchmarks", "cells.py")
    assert harness.command_line(script, ["--units", "400", "a b"], backend="jax") == (
        "KERAS_BACKEND=jax python benchmarks/cells.py --units 400 'a b'")


# === The JSON file ===


def test_log_prints_the_time_of_day_then_the_parts(harness, capsys, monkeypatch):
    monkeypatch.setattr(harness.time, "strftime", lambda pattern: f"<{pattern}>")
    harness.log("epoch", 3, "valid 84.3")
    assert capsys.readouterr().out == "<%H:%M:%S> epoch 3 valid 84.3\n"


def test_write_json_replaces_the_file_whole(harness, tmp_path):
    path = tmp_path / "new" / "out.json"  # a missing folder is made
    harness.write_json(str(path), {"a": [1, 2]})
    assert json.loads(path.read_text()) == {"a": [1, 2]}
    harness.write_json(str(path), {"b": 3}, indent=None)
    assert path.read_text() == '{"b": 3}'
    assert os.listdir(path.parent) == ["out.json"]  # no temporary file left


def test_an_interrupted_write_leaves_the_old_file_intact(harness, tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    harness.write_json(str(path), {"units": {"first": 1}})
    before = path.read_text()

    def interrupted(data, f, **kwargs):
        f.write('{"units": {"fir')  # part of the new text, then the run stops
        raise KeyboardInterrupt

    monkeypatch.setattr(harness.json, "dump", interrupted)
    with pytest.raises(KeyboardInterrupt):
        harness.write_json(str(path), {"units": {"first": 1, "second": 2}})
    assert path.read_text() == before
    assert os.listdir(tmp_path) == ["out.json"]


def test_merge_keeps_the_earlier_units(harness, tmp_path):
    path = str(tmp_path / "study.json")
    harness.merge_json(path, ["units", "lstm"], {"perplexity": 90.0})
    harness.merge_json(path, ["units", "rlstm"], {"perplexity": 85.0})
    harness.merge_json(path, ["part_a", "jax", "rows"], {"cell": "lstm"}, append=True)
    data = harness.merge_json(path, ["part_a", "jax", "rows"], {"cell": "rlstm"}, append=True)
    assert data == harness.read_json(path) == {
        "units": {"lstm": {"perplexity": 90.0}, "rlstm": {"perplexity": 85.0}},
        "part_a": {"jax": {"rows": [{"cell": "lstm"}, {"cell": "rlstm"}]}},
    }
    harness.merge_json(path, "seconds", 12.5)
    assert harness.read_json(path)["units"]["lstm"] == {"perplexity": 90.0}
    assert harness.read_json(str(tmp_path / "none.json"), default={}) == {}


def test_a_record_resumes_only_with_its_own_settings(harness, tmp_path):
    path = str(tmp_path / "study.json")
    record = harness.Record(path, {"epochs": 5, "grid": (1, 2)}, rows=[])
    record.data["rows"].append({"name": "lstm"})
    record.save()
    # A tuple, and the list that JSON made of it, are the same setting.
    again = harness.Record(path, {"epochs": 5, "grid": (1, 2)}, resume=True, rows=[])
    assert again.data["rows"] == [{"name": "lstm"}]
    fresh = harness.Record(path, {"epochs": 5, "grid": [1, 2]}, resume=False, rows=[])
    assert fresh.data == {"settings": {"epochs": 5, "grid": [1, 2]}, "rows": []}
    with pytest.raises(ValueError, match=r"resume that study.*\['epochs'\]"):
        harness.Record(path, {"epochs": 6, "grid": [1, 2]}, resume=True)
    other_backend = {"epochs": 5, "grid": [1, 2], "backend": "torch"}
    assert harness.Record(path, other_backend, resume=True, ignore=("backend",)).data[
        "rows"] == [{"name": "lstm"}]


# === A fresh process per backend ===

WORKER = textwrap.dedent('''
    import os

    TOUCHED = []


    def work(args, n):
        return {"backend": os.environ["KERAS_BACKEND"], "x": args.x, "n": n,
                "namespace": type(args).__name__, "extra": os.environ.get("EXTRA")}


    def fail():
        raise SystemExit(3)


    def cores():
        return sorted(os.sched_getaffinity(0))


    def xla_thread_shares(seconds=1.5):
        """The share of this process's CPU time each of its threads spent on
        XLA work (a recurrent forward and backward pass, again and again),
        largest first."""
        import time

        import jax
        import jax.numpy as jnp

        def loss(w, x):
            def body(h, xt):
                h = jnp.tanh(xt @ w + h @ w)
                return h, h
            _, hs = jax.lax.scan(body, jnp.zeros((32, 256)), x)
            return (hs @ jnp.ones((256, 4000))).sum()

        step = jax.jit(jax.grad(loss))
        w, x = jnp.ones((256, 256)) * 0.01, jnp.ones((35, 32, 256))
        step(w, x).block_until_ready()

        def cpu_ticks():
            ticks = {}
            for thread in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{thread}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:  # a thread that ended
                    continue
                ticks[thread] = int(fields[11]) + int(fields[12])  # user + system
            return ticks

        before, start = cpu_ticks(), time.time()
        while time.time() - start < seconds:
            step(w, x).block_until_ready()
        after = cpu_ticks()
        spent = [after[t] - before.get(t, 0) for t in after]
        return sorted((s / max(sum(spent), 1) for s in spent), reverse=True)


    if __name__ == "__main__":
        raise SystemExit("the worker must not run the script's main block")
''')


@pytest.fixture(scope="module")
def worker_module(tmp_path_factory):
    path = tmp_path_factory.mktemp("worker") / "worker_script.py"
    path.write_text(WORKER)
    module = load_module(str(path), "worker_script")
    yield module
    sys.modules.pop("worker_script", None)


def test_run_in_backend_calls_the_function_in_a_fresh_process(harness, worker_module):
    result = harness.run_in_backend(
        worker_module.work, argparse.Namespace(x=[1, 2]), 7, backend="torch",
        env={"EXTRA": "yes"},
    )
    assert result == {"backend": "torch", "x": [1, 2], "n": 7, "namespace": "Namespace",
                      "extra": "yes"}
    rows = harness.run_each_backend(worker_module.work, ["jax", "tensorflow"],
                                    argparse.Namespace(x=0), 1)
    assert [rows[b]["rows"]["backend"] for b in rows] == ["jax", "tensorflow"]
    assert all(len(rows[b]["load_average_before"]) == 3 for b in rows)


def test_a_failed_worker_raises_with_its_status(harness, worker_module):
    with pytest.raises(harness.WorkerError) as raised:
        harness.run_in_backend(worker_module.fail, capture_output=True)
    assert raised.value.returncode == 3


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_a_worker_given_a_core_runs_on_it_alone(harness, worker_module):
    mine = sorted(os.sched_getaffinity(0))
    pinned = harness.run_in_backend(
        worker_module.cores, env={harness.CORES_VARIABLE: str(mine[-1])})
    assert pinned == [mine[-1]]
    # Set empty, the variable pins nothing: the worker has every core this process has.
    assert harness.run_in_backend(worker_module.cores, env={harness.CORES_VARIABLE: ""}) == mine


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
@pytest.mark.parametrize("value", ["x", "0,,1", "-1", "1.5", str(10**6)])
def test_cores_that_do_not_parse_or_are_not_ours_are_a_value_error(harness, value):
    before = os.sched_getaffinity(0)
    with pytest.raises(ValueError, match=harness.CORES_VARIABLE) as raised:
        harness.pin_to_cores(value)
    assert repr(value) in str(raised.value)
    assert os.sched_getaffinity(0) == before  # nothing changed


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity")
                    else True, reason="needs CPU affinity and two cores")
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="no per-thread CPU times")
@pytest.mark.skipif(os.environ.get("KERAS_BACKEND", "jax") != "jax",
                    reason="a JAX process (once, in the JAX leg)")
def test_one_core_is_how_a_jax_process_runs_one_thread(harness, worker_module):
    """What `one_core_environment` stands on: pinned to one core, one thread
    does XLA's work; the `XLA_FLAGS` that read as one thread leave it to a
    pool of several (each doing at least a fifth)."""
    one_core = harness.one_core_environment()
    assert one_core == {harness.CORES_VARIABLE: str(sorted(os.sched_getaffinity(0))[0])}
    pinned = harness.run_in_backend(worker_module.xla_thread_shares, backend="jax",
                                    env=dict(one_core, XLA_FLAGS=""))
    assert pinned[0] > 0.9, pinned
    flagged = harness.run_in_backend(
        worker_module.xla_thread_shares, backend="jax",
        env={harness.CORES_VARIABLE: "", "XLA_FLAGS": harness.XLA_ONE_THREAD_FLAGS})
    assert flagged[1] > 0.2, flagged


@pytest.mark.parametrize("given, huge_pages, expected", [
    (None, True, "glibc.malloc.hugetlb=1"),
    (None, False, ""),
    ("glibc.malloc.arena_max=2", True, "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"),
    ("glibc.malloc.hugetlb=2:glibc.malloc.arena_max=2", True,
     "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2"),  # the user's own value kept
    ("glibc.malloc.hugetlb=1:glibc.malloc.arena_max=2", False, "glibc.malloc.arena_max=2"),
])
def test_the_allocator_entry_adds_or_removes_only_huge_pages(harness, given, huge_pages,
                                                             expected):
    environ = {} if given is None else {"GLIBC_TUNABLES": given}
    assert harness.allocator_environment(huge_pages, environ) == {"GLIBC_TUNABLES": expected}


FAULTS = textwrap.dedent('''
    import ctypes, resource
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    size = 64 << 20  # above the 32 MB glibc keeps for reuse, as a JAX step's temporaries
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        p = libc.malloc(size)
        ctypes.memset(p, 1, size)
        libc.free(ctypes.c_void_p(p))
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
''')


def test_the_huge_page_mode_is_the_kernel_line_or_none(harness, tmp_path):
    mode = tmp_path / "enabled"
    mode.write_text("always [madvise] never\n")
    assert harness.transparent_huge_pages(str(mode)) == "always [madvise] never"
    assert harness.transparent_huge_pages(str(tmp_path / "absent")) is None


@pytest.mark.parametrize("confstr, expected", [
    ("glibc 2.35", (2, 35)), ("glibc 2.39.1", (2, 39)), ("musl", ()), (None, ()),
])
def test_glibc_version_is_major_minor_or_empty(harness, monkeypatch, confstr, expected):
    def fake(name):
        assert name == "CS_GNU_LIBC_VERSION"
        if confstr is None:
            raise ValueError("unrecognized configuration name")
        return confstr

    monkeypatch.setattr(harness.os, "confstr", fake, raising=False)
    assert harness.glibc_version() == expected


@pytest.mark.skipif("[madvise]" not in (HARNESS.transparent_huge_pages() or "")
                    or HARNESS.glibc_version() < (2, 35),
                    reason="glibc's hugetlb tunable needs glibc 2.35+ and THP in madvise mode")
def test_huge_pages_spare_a_process_its_page_faults(harness):
    """What the study's workers start with it for: a process that maps,
    fills and frees 64 MB five times faults its pages in 4 KB at a time
    without it (16,384 a pass) and in 2 MB pages with it."""
    import subprocess

    def faults(huge_pages):
        env = dict(os.environ, **harness.allocator_environment(huge_pages))
        done = subprocess.run([sys.executable, "-c", FAULTS], env=env, check=True,
                              capture_output=True, text=True)
        return int(done.stdout)

    default, huge = faults(False), faults(True)
    assert default >= 5 * 16_384 * 0.9, default
    assert huge < default / 5, (default, huge)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_run_on_one_core_pins_this_process_and_its_children(harness, monkeypatch):
    before = os.sched_getaffinity(0)
    monkeypatch.delenv(harness.CORES_VARIABLE, raising=False)
    try:
        cores = harness.run_on_one_core()
        assert cores == {min(before)} == os.sched_getaffinity(0)
        assert os.environ[harness.CORES_VARIABLE] == str(min(before))
        # A choice already made is kept.
        os.sched_setaffinity(0, before)
        monkeypatch.setenv(harness.CORES_VARIABLE, str(max(before)))
        assert harness.run_on_one_core() == {max(before)} == os.sched_getaffinity(0)
    finally:
        os.sched_setaffinity(0, before)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_a_free_core_is_one_no_running_worker_has(harness):
    mine = sorted(os.sched_getaffinity(0))
    assert harness.free_core([]) == mine[0]
    assert harness.free_core(mine[:1]) == (mine[1] if len(mine) > 1 else None)
    assert harness.free_core(mine) is None  # all taken: the next worker shares them
