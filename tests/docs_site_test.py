"""The documentation site builds with `mkdocs build --strict` (mkdocs.yml):
no broken link, anchor or reference, every page of docs/ in the nav, every
docstring parsed without a warning; and its API reference has an entry for
every public name of the package (its `__all__`, else what its `__init__`
imports), read here from the imported package rather than from the
hook that wrote the pages (scripts/mkdocs_api_reference.py)."""

import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys

import pytest

from testing import load_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Builds the site from the package's source; the same on every backend.
pytestmark = pytest.mark.once_per_suite


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The built site's directory and mkdocs' output."""
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason="the docs site needs the `test` extra")
    site_dir = tmp_path_factory.mktemp("site")
    # Material prints a notice about MkDocs 2.0 at every build; not ours.
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return site_dir, result.returncode, result.stdout + result.stderr


@pytest.fixture(scope="module")
def api_reference():
    return load_module(os.path.join(ROOT, "scripts", "mkdocs_api_reference.py"), "mkdocs_api_reference")


def test_strict_build_passes_without_warnings(site):
    _, returncode, output = site
    problems = [line for line in output.splitlines() if re.match(r"(WARNING|ERROR)\b", line)]
    assert returncode == 0 and not problems, output


def _public_names(module):
    """`__all__`, else the module's public attributes that are not modules
    (a package's submodules are attributes once imported)."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    ]


def _ids(page):
    with open(page, encoding="utf-8") as file:
        return set(re.findall(r'\bid="([^"]+)"', file.read()))


def _subpackages():
    import keras_mogrifier

    return [
        info.name
        for info in pkgutil.iter_modules(keras_mogrifier.__path__)
        if info.ispkg and not info.name.startswith("_")
    ]


def test_every_public_subpackage_has_a_page_or_a_reason(site, api_reference):
    site_dir, returncode, output = site
    assert returncode == 0, output
    subpackages = _subpackages()
    assert "layers" in subpackages
    missing = [
        name
        for name in subpackages
        if name not in api_reference.EXCLUDED
        and not (site_dir / "api" / name / "index.html").exists()
    ]
    assert missing == []
    assert set(api_reference.EXCLUDED) <= set(subpackages)


def test_every_public_name_has_an_entry(site, api_reference):
    site_dir, returncode, output = site
    assert returncode == 0, output
    pages = {"keras_mogrifier": "keras_mogrifier"}
    pages.update(
        {f"keras_mogrifier.{name}": name for name in _subpackages()
         if name not in api_reference.EXCLUDED}
    )
    missing, count = {}, 0
    for package, page in pages.items():
        names = _public_names(importlib.import_module(package))
        ids = _ids(site_dir / "api" / page / "index.html")
        count += len(names)
        missing[package] = [name for name in names if f"{package}.{name}" not in ids]
    assert count > 100
    assert {package: names for package, names in missing.items() if names} == {}
