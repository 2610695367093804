"""The guides' code blocks run, or say why not (docs/testing.md, "The guides' code blocks").

Every ```python and ```bash block of README.md and docs/*.md (not the
measurement records docs/results*) carries a marker (`docs_blocks.py`):
`<!-- not run: REASON -->`, or `<!-- run ... -->` with what the block needs
to run on tiny settings, all of it visible in the marker. A block without
one, a marker that cannot be read, or a replacement that finds nothing fails
`test_every_block_is_run_or_marked_not_run`, naming the page and the line.

The Python blocks run in a worker process per backend
(`docs_blocks_worker.py`; the backend is the page's, `JAX_PAGES`, whatever
this process's): each page's blocks in order, in one namespace, in a fresh
directory. The shell blocks that run are `bash` in a fresh directory, with
`.venv` there pointing at this environment, on JAX. The checkout's package
is first on PYTHONPATH. Nothing depends on this process's backend: once per
suite.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

import docs_blocks
from keras_mogrifier.data import synthetic_lines

pytestmark = pytest.mark.once_per_suite

ROOT = docs_blocks.ROOT
WORKER = pathlib.Path(__file__).with_name("docs_blocks_worker.py")
BLOCKS = docs_blocks.all_blocks()


def _runs_here(block):
    return block.error is None and block.marker.runs and block.marker.by is None


PYTHON_PAGES = sorted({b.page for b in BLOCKS if b.language == "python" and _runs_here(b)})
SHELL_BLOCKS = [b for b in BLOCKS if b.language == "shell" and _runs_here(b)]


# A page's blocks run on PyTorch, on one thread: a tiny model's few steps
# run eagerly, with nothing to compile. Measured, CPU seconds of all the
# Python blocks but language-models.md's: 18 on PyTorch against 114 on JAX
# (its compiling); PyTorch's threads, spinning beside a busy core, cost
# several times more than one thread (OMP_NUM_THREADS). Except where a block
# asks for `jit_compile=True`, which Keras's PyTorch `fit` hands to
# torch.compile: those pages run on JAX (language-models.md: 227 s on
# PyTorch, 7 on JAX). A shell block is a process of its own: JAX, which
# imports faster (training-recipe.md's ρ_t check: 3 s against 5).
JAX_PAGES = ("docs/language-models.md",)


def _backend(page):
    return "jax" if page in JAX_PAGES else "torch"


def _env(backend="jax"):
    """The backend, the checkout's package, and the suite's quick compiling (conftest)."""
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if os.environ.get("TEST_COMPILE", "marked") == "marked":
        env.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
    return env


def _directory(blocks, path):
    """A fresh working directory with the blocks' `files:` (tiny synthetic texts)."""
    path.mkdir(parents=True, exist_ok=True)
    for block in blocks:
        for name in block.marker.files:
            target = path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            split = next((s for s in ("valid", "test") if s in target.name), "train")
            tokens = 3000 if split == "train" else 400
            target.write_text("\n".join(synthetic_lines(tokens, seed=0, split=split)) + "\n")
    return path


def test_every_block_is_run_or_marked_not_run():
    assert len(BLOCKS) > 50, "the guides' blocks were not found"
    errors = [b.error for b in BLOCKS if b.error]
    assert not errors, "\n".join(errors)


def test_the_blocks_that_compile_with_torch_compile_run_on_jax():
    """A block on a PyTorch page with `jit_compile=True` would take minutes."""
    slow = [b.where for b in BLOCKS if _runs_here(b) and _backend(b.page) == "torch"
            and "jit_compile=True" in docs_blocks.block_code(b)]
    assert not slow, f"add their pages to JAX_PAGES: {slow}"


@pytest.fixture(scope="module")
def python_results(request, tmp_path_factory):
    """Runs the selected pages' Python blocks, a worker per backend.

    Returns {page: (its results, the worker's finished process)}.
    """
    base = tmp_path_factory.mktemp("docs_blocks")
    selected = {getattr(item, "callspec", None) and item.callspec.params.get("page")
                for item in request.session.items}
    plans = {}
    for page in (p for p in PYTHON_PAGES if p in selected):
        blocks = [b for b in BLOCKS if b.page == page and b.language == "python"
                  and _runs_here(b)]
        directory = _directory(blocks, base / page.replace("/", "_"))
        plans.setdefault(_backend(page), []).append({
            "page": page, "path": str(ROOT / page), "directory": str(directory),
            "blocks": [{"line": b.line, "marker_line": b.marker.line, "given": b.marker.given,
                        "code": docs_blocks.block_code(b), "then": b.marker.then}
                       for b in blocks],
        })
    outcome = {}
    for backend, plan in plans.items():
        plan_path, results_path = base / f"{backend}_plan.json", base / f"{backend}_results.json"
        plan_path.write_text(json.dumps(plan))
        done = subprocess.run([sys.executable, str(WORKER), str(plan_path), str(results_path)],
                              env=_env(backend), capture_output=True, text=True, timeout=600)
        results = json.loads(results_path.read_text()) if results_path.exists() else {}
        outcome.update({page["page"]: (results.get(page["page"]), done) for page in plan})
    return outcome


@pytest.mark.parametrize("page", PYTHON_PAGES)
def test_the_pages_python_blocks_run(page, python_results):
    results, done = python_results[page]
    assert results is not None, (
        f"the worker stopped before {page} (exit {done.returncode}):\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    for result in results:
        assert result["error"] is None, f"{page}:{result['line']} failed:\n{result['error']}"
    wanted = [b.line for b in BLOCKS if b.page == page and b.language == "python"
              and _runs_here(b)]
    assert [r["line"] for r in results] == wanted, (
        f"the worker stopped within {page} (exit {done.returncode}):\n{done.stderr[-3000:]}"
    )


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=[b.where for b in SHELL_BLOCKS])
def test_the_shell_block_runs(block, tmp_path):
    directory = _directory([block], tmp_path)
    # `.venv/bin/python` in a block is this environment's interpreter.
    (directory / ".venv").symlink_to(pathlib.Path(sys.executable).parent.parent)
    env = _env("jax")
    env["PATH"] = os.pathsep.join([str(pathlib.Path(sys.executable).parent), env["PATH"]])
    script = "\n".join(block.marker.given + [docs_blocks.block_code(block)] + block.marker.then)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=directory, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (
        f"{block.where} failed (exit {done.returncode}):\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
