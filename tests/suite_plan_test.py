"""scripts/test.sh (the README's test command, what `.ci/run` calls) splits
the suite into one pytest process per (backend, folder): with no arguments,
with pytest options only, and with test paths. `TEST_DRY_RUN=1` prints each
command line instead of running it."""

import glob
import os
import shlex
import subprocess

import pytest

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
