"""The package as users install it: a wheel in a fresh virtual environment.

`python -m build --no-isolation` (the `build` package of the `test` extra)
makes the sdist and, from it, the wheel, with the setuptools of this
environment: an isolated build would download setuptools, and the suite
runs offline. A fresh virtual environment in tmp_path gets the wheel with
its `jax` extra from no index (`pip install --no-index "WHEEL[jax]"`): the
dependencies are this environment's, made importable by a `.pth` file that
names its site-packages (a path line: its `.pth` files, and so its editable
install of keras_mogrifier, are not run), so pip resolves the extra's
requirements against them without a download. Then, from tmp_path with
PYTHONPATH unset, the installed package must be the one imported, and the
README's quick start (on the tiny settings its marker names: docs_blocks.py),
`python -m keras_mogrifier` and the `keras-mogrifier` command must run
there.
"""

import ast
import email.parser
import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest

import docs_blocks
from keras_mogrifier._version import __version__
from keras_mogrifier.data import synthetic_lines

# Installing is the same on every backend: once per suite. The commands run
# on JAX (`_user_env`).
pytestmark = pytest.mark.once_per_suite

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXTRAS = ("jax", "torch", "keras-hub", "plot", "tuning")


def _run(args, cwd, env=None):
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, (
        f"{' '.join(map(str, args))} failed ({done.returncode}):\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done


def _user_env():
    """A user's shell: no PYTHONPATH, no TensorFlow log setting of ours.

    The backend is JAX, the extra installed, whatever this process's: the
    quick start (`jit_compile=True`, which Keras's PyTorch `fit` hands to
    torch.compile) took 172 s on PyTorch against 30 s on JAX on this 2-core
    machine under load.
    """
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL", "VIRTUAL_ENV")}
    env["KERAS_BACKEND"] = "jax"
    return env


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    dist = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), ROOT],
        capture_output=True, text=True, timeout=600,
    )
    if "No module named build" in done.stderr:
        pytest.fail("`build` is missing: it is in the test extra (bash scripts/setup.sh test)")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wheels = sorted(dist.glob("*.whl"))
    sdists = sorted(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in dist.iterdir())
    return wheels[0], sdists[0]


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory):
    """A fresh virtual environment with the wheel (and its `jax` extra) installed."""
    wheel, _ = built
    home = tmp_path_factory.mktemp("user")
    path = home / "venv"
    _run([sys.executable, "-m", "venv", str(path)], cwd=home)
    python = path / "bin" / "python"
    paths = json.loads(_run(
        [python, "-c", "import json, sysconfig; print(json.dumps(sysconfig.get_paths()))"],
        cwd=home, env=_user_env(),
    ).stdout)
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    with open(os.path.join(paths["purelib"], "dependencies.pth"), "w") as f:
        f.write("".join(f"{p}\n" for p in ours))
    done = _run(
        [python, "-m", "pip", "install", "--no-index", "--disable-pip-version-check",
         f"{wheel}[jax]"],
        cwd=home, env=_user_env(),
    )
    assert "does not provide the extra" not in done.stdout + done.stderr
    return {"home": home, "prefix": path, "python": python,
            "script": os.path.join(paths["scripts"], "keras-mogrifier")}


def test_the_wheel_and_sdist_declare_one_version_the_extras_and_the_command(built):
    wheel, sdist = built
    assert wheel.name == f"keras_mogrifier-{__version__}-py3-none-any.whl"
    assert sdist.name == f"keras_mogrifier-{__version__}.tar.gz"
    with zipfile.ZipFile(wheel) as z:
        info = f"keras_mogrifier-{__version__}.dist-info"
        metadata = email.parser.Parser().parsestr(z.read(f"{info}/METADATA").decode())
        entry_points = z.read(f"{info}/entry_points.txt").decode()
        names = z.namelist()
    assert metadata["Version"] == __version__
    assert metadata["License-Expression"] == "Apache-2.0"
    assert set(metadata.get_all("Provides-Extra")) >= set(EXTRAS)
    requires = metadata.get_all("Requires-Dist")
    assert any(r.startswith("jax") and 'extra == "jax"' in r for r in requires)
    classifiers = metadata.get_all("Classifier")
    for version in ("3.10", "3.11", "3.12"):
        assert f"Programming Language :: Python :: {version}" in classifiers
    assert "Topic :: Scientific/Engineering :: Artificial Intelligence" in classifiers
    assert re.search(r"^keras-mogrifier = keras_mogrifier\.cli:main$", entry_points, re.M)
    assert "keras_mogrifier/__main__.py" in names
    assert all(n.startswith(("keras_mogrifier/", f"{info}/")) for n in names)
    with tarfile.open(sdist) as t:
        members = {m.split("/", 1)[1] for m in t.getnames() if "/" in m}
    assert {"pyproject.toml", "README.md", "CHANGELOG.md",
            "keras_mogrifier/_version.py", "keras_mogrifier/__main__.py"} <= members
    changelog = open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8").read()
    assert f"## [{__version__}]" in changelog


def test_the_installed_package_is_imported_not_the_checkout(venv):
    code = (
        "import importlib.metadata, os, keras_mogrifier\n"
        "print(keras_mogrifier.__file__)\n"
        "print(keras_mogrifier.__version__, importlib.metadata.version('keras-mogrifier'))\n"
        "print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'))\n"
    )
    out = _run([venv["python"], "-c", code], cwd=venv["home"], env=_user_env()).stdout
    location, versions, log_level = out.splitlines()[-3:]
    assert location.startswith(str(venv["prefix"])) and ROOT not in location
    assert versions == f"{__version__} {__version__}"
    # A program that imports the package does not get the command line's
    # quiet start (it sets 3; JAX sets 1 when it is imported).
    assert log_level != "3"


def test_the_readmes_quick_start_runs_on_tiny_settings(venv):
    # The README's quick start and docs/getting-started.md's show the same
    # code; the README's marker names the tiny settings (each must apply).
    by_this_test = docs_blocks.blocks_run_by("tests/pipeline/package_install_test.py")
    blocks = {b.page: b for b in by_this_test}
    assert sorted(blocks) == ["README.md", "docs/getting-started.md"]
    assert blocks["README.md"].code == blocks["docs/getting-started.md"].code, (
        "the README's quick start and docs/getting-started.md's differ"
    )
    script = venv["home"] / "quick_start.py"
    script.write_text(docs_blocks.block_code(blocks["README.md"]))
    out = _run([venv["python"], script.name], cwd=venv["home"], env=_user_env()).stdout
    evaluation, sample = out.strip().splitlines()[-2:]
    result = ast.literal_eval(evaluation)
    assert 1.0 < result["perplexity"] < 10_000 and result["num_tokens"] == 200
    assert sample.startswith("the company said")  # text in, text out


def test_the_command_line_runs_the_main_job(venv):
    env = _user_env()
    home = venv["home"]
    # Both ways in print the usage with the command.
    for command, name in (
        ([venv["python"], "-m", "keras_mogrifier"], "python -m keras_mogrifier"),
        ([venv["script"]], "keras-mogrifier"),
    ):
        usage = _run(command + ["--help"], cwd=home, env=env)
        assert usage.stdout.startswith(f"usage: {name} [-h] [--version] COMMAND")
        assert re.search(r"^ +train +train and evaluate", usage.stdout, re.M)
        assert usage.stderr == ""
    # The main job on a small text of one's own, in seconds.
    text = home / "notes.txt"
    text.write_text("\n".join(synthetic_lines(4000, seed=1, split="train")) + "\n")
    done = _run(
        [venv["script"], "train", "--text", text.name, "--units", "16", "--cell", "lstm",
         "--layers", "1", "--batch-size", "4", "--bptt", "10", "--epochs", "1",
         "--dynamic-tuning-tokens", "60", "--dynamic-learning-rates", "1e-5",
         "--verbose", "0", "--results-json", "results.json", "--save-model", "model.keras"],
        cwd=home, env=env,
    )
    # Quiet: TensorFlow, imported to be seeded, printed nothing.
    assert done.stderr == ""
    results = json.loads((home / "results.json").read_text())
    assert results["corpus_source"] == "file" and results["level"] == "word"
    for key in ("test_perplexity", "test_dynamic_perplexity"):
        assert 1.0 < results[key] < 10_000
    assert (home / "model.keras").exists()
    tail = done.stdout.strip().splitlines()[-3:]
    assert tail[0].startswith("sample (top-p 0.9, seed 0)")
    assert tail[1].removeprefix("  prompt:       ") == results["sample"]["prompt"]
