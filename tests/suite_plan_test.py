"""scripts/test.sh (the README's test command, what `.ci/run` calls) splits
the suite into one pytest process per (backend, folder): with no arguments,
with pytest options only, and with test paths. `TEST_DRY_RUN=1` prints each
command line instead of running it."""

import glob
import os
import shlex
import subprocess

import pytest

from testing import load_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs bash and reads its output: the same on every backend.
pytestmark = pytest.mark.once_per_suite


def _plan(*args, backends="tensorflow jax torch"):
    """`[(backend, pytest arguments)]` that test.sh would run."""
    env = dict(os.environ, TEST_DRY_RUN="1", KERAS_BACKEND=backends)
    done = subprocess.run(
        ["bash", "scripts/test.sh", *args], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    plan = []
    for line in done.stdout.splitlines():
        if line.startswith("=== plan: "):
            words = shlex.split(line[len("=== plan: "):])
            assert words[0].startswith("KERAS_BACKEND=") and words[1] == "pytest", line
            plan.append((words[0].split("=", 1)[1], words[2:]))
    assert "dry run: nothing ran" in done.stdout
    return plan


def _test_files():
    return sorted(
        os.path.relpath(p, ROOT)
        for p in glob.glob(os.path.join(ROOT, "tests", "**", "*_test.py"), recursive=True)
    )


@pytest.mark.parametrize("options", [(), ("-p", "no:cacheprovider")])
def test_each_backend_runs_every_test_file_once_in_folder_groups(options):
    plan = _plan(*options)
    assert {backend for backend, _ in plan} == {"tensorflow", "jax", "torch"}
    files = _test_files()
    for backend in ("tensorflow", "jax", "torch"):
        covered = []
        for _, words in (p for p in plan if p[0] == backend):
            # The given options first, then the group's paths; never an
            # empty argument (pytest reads "" as the current directory: the
            # whole suite in every process).
            assert words[: len(options)] == list(options)
            paths = words[len(options):]
            assert paths and all(paths), words
            for path in paths:
                full = os.path.join(ROOT, path)
                covered += (
                    [os.path.relpath(p, ROOT) for p in glob.glob(
                        os.path.join(full, "**", "*_test.py"), recursive=True)]
                    if os.path.isdir(full) else [path]
                )
        assert sorted(covered) == files, backend


def test_given_paths_run_in_one_process_per_backend():
    plan = _plan("tests/layers", "-x", backends="jax torch")
    assert sorted(plan) == [("jax", ["tests/layers", "-x"]), ("torch", ["tests/layers", "-x"])]


def _sourced(given):
    """GLIBC_TUNABLES after `scripts/allocator.sh` ran on `given` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if given is not None:
        env["GLIBC_TUNABLES"] = given
    done = subprocess.run(["bash", "-c", 'source scripts/allocator.sh; printf %s "$GLIBC_TUNABLES"'],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return done.stdout


@pytest.mark.parametrize("given", [None, "", "glibc.malloc.arena_max=2",
                                   "glibc.malloc.hugetlb=2:glibc.malloc.arena_max=2",
                                   "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0"])
def test_the_scripts_allocator_is_the_benchmarks_huge_pages(given):
    """scripts/allocator.sh (what main.sh and test.sh start Python with)
    sets the tunables the benchmarks' workers get
    (`_harness.allocator_environment`): huge pages added, the user's
    others and their own `glibc.malloc.hugetlb` kept."""
    harness = load_module(os.path.join(ROOT, "benchmarks", "_harness.py"), "_harness")
    environ = {} if given is None else {"GLIBC_TUNABLES": given}
    expected = harness.allocator_environment(True, environ)["GLIBC_TUNABLES"]
    assert sorted(_sourced(given).split(":")) == sorted(expected.split(":"))
    assert "glibc.malloc.hugetlb=" in expected


def test_the_test_command_and_the_main_job_start_python_on_huge_pages(monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    env = dict(os.environ, TEST_DRY_RUN="1", KERAS_BACKEND="jax")
    done = subprocess.run(["bash", "scripts/test.sh", "tests/layers"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("GLIBC_TUNABLES=glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1)"
            in done.stdout), done.stdout
    with open(os.path.join(ROOT, "scripts", "main.sh")) as f:
        main = f.read()
    # Sourced (not run) before the job's Python starts, so that it inherits it.
    assert -1 < main.find("\nsource scripts/allocator.sh") < main.find("\nexec .venv/bin/python")
