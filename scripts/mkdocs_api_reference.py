"""MkDocs hook: writes the API reference pages from the package's `__init__`s.

One page per public subpackage (`docs/api/<name>.md` in the built site, never
on disk) and one for the top-level names, each listing every public name:
the package's `__all__` where it has one, else every name its `__init__`
imports or defines without a leading underscore. The names are read from
the source (no import of the package or of a Keras backend); mkdocstrings
renders each from its docstring. A public name added to an `__init__` is
therefore documented on the next build, and a new subpackage gets a page
that mkdocs.yml's nav must list (`mkdocs build --strict` fails on a page
left out of the nav). tests/docs_site_test.py builds the site and checks
every public name's entry.
"""

import ast
import pathlib

import griffe
from mkdocs.structure.files import File

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = "keras_mogrifier"
API_DIR = "api"

# Subpackages without a reference page, and why.
EXCLUDED = {
    "backend": (
        "the seam between the library and one Keras backend, for the "
        "library's own modules and tests; its functions are listed in its "
        "module docstring and described in [Scaling and backends](../scaling.md)"
    ),
}


def public_names(init_file):
    """The public names of a package: its `__all__`, else what it binds.

    Without `__all__`: the names its `__init__` imports with `from … import`
    or defines (functions, classes, assignments) at module level, without a
    leading underscore, in source order.
    """
    tree = ast.parse(pathlib.Path(init_file).read_text(), filename=str(init_file))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return list(ast.literal_eval(node.value))
    names = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            bound = [alias.asname or alias.name for alias in node.names]
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound = [node.name]
        elif isinstance(node, ast.Assign):
            bound = [t.id for t in node.targets if isinstance(t, ast.Name)]
        else:
            bound = []
        names += [n for n in bound if not n.startswith("_") and n not in names]
    return names


def subpackages():
    """The public subpackages that get a page, sorted by name."""
    return sorted(
        path.parent.name
        for path in (ROOT / PACKAGE).glob("*/__init__.py")
        if not path.parent.name.startswith("_") and path.parent.name not in EXCLUDED
    )


def _summary(obj):
    """The first sentence-line of an object's docstring, on one line."""
    if obj.docstring is None:
        return ""
    paragraph = obj.docstring.value.strip().split("\n\n")[0]
    return " ".join(paragraph.split()).replace("|", "\\|")


def _load():
    return griffe.load(PACKAGE, search_paths=[str(ROOT)], resolve_aliases=False)


def _directive(path, **options):
    lines = [f"::: {path}"]
    if options:
        lines.append("    options:")
        lines += [f"      {key}: {str(value).lower()}" for key, value in options.items()]
    return "\n".join(lines) + "\n"


def _module_docstring(path):
    return _directive(
        path, members=False, show_root_heading=False, show_root_toc_entry=False
    )


def subpackage_page(name, package):
    """The Markdown of `keras_mogrifier.<name>`'s page."""
    module = package[name]
    names = public_names(ROOT / PACKAGE / name / "__init__.py")
    path = f"{PACKAGE}.{name}"
    parts = [f"# `{path}`\n", _module_docstring(path)]
    parts.append("| name | summary |\n| --- | --- |")
    parts += [
        f"| [`{n}`][{path}.{n}] | {_summary(module[n])} |" for n in names
    ]
    parts.append("")
    parts += [_directive(f"{path}.{n}") for n in names]
    return "\n".join(parts)


def top_level_page(package):
    """The Markdown of the page of `keras_mogrifier`'s own names.

    A name that a subpackage's page documents links there; the others are
    rendered on this page.
    """
    init = ROOT / PACKAGE / "__init__.py"
    tree = ast.parse(init.read_text())
    origin = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                origin[alias.asname or alias.name] = (node.module, alias.name)
    pages = set(subpackages())
    rows, rendered = [], []
    for n in public_names(init):
        module, imported = origin.get(n, (PACKAGE, n))
        parts = module.split(".")
        anchor = f'<a id="{PACKAGE}.{n}"></a>'
        if module == PACKAGE and n in pages:
            rows.append(
                f"| {anchor}[`{n}`]({n}.md) | {_summary(package[n])} | "
                f"[`{PACKAGE}.{n}`]({n}.md) |"
            )
        elif (
            len(parts) >= 2
            and parts[1] in pages
            and imported in public_names(ROOT / PACKAGE / parts[1] / "__init__.py")
        ):
            target = f"{PACKAGE}.{parts[1]}.{imported}"
            rows.append(
                f"| {anchor}[`{n}`][{target}] | {_summary(package[n])} | "
                f"[`{PACKAGE}.{parts[1]}`]({parts[1]}.md) |"
            )
        else:
            rows.append(
                f"| [`{n}`][{PACKAGE}.{n}] | {_summary(package[n])} | this page |"
            )
            rendered.append(n)
    parts = [
        f"# `{PACKAGE}`\n",
        _module_docstring(PACKAGE),
        "The names `import keras_mogrifier as km` gives (`km.LanguageModel`, …). "
        "Most are the same objects as a subpackage's and are documented on "
        "its page.\n",
        "| name | summary | documented in |\n| --- | --- | --- |",
        *rows,
        "",
    ]
    parts += [_directive(f"{PACKAGE}.{n}") for n in rendered]
    return "\n".join(parts)


def index_page(package):
    """The Markdown of the API reference's first page."""
    rows = [f"| [`{PACKAGE}`]({PACKAGE}.md) | the top-level names |"]
    rows += [
        f"| [`{PACKAGE}.{n}`]({n}.md) | {_summary(package[n])} |" for n in subpackages()
    ]
    excluded = [f"- `{PACKAGE}.{n}`: {why}." for n, why in sorted(EXCLUDED.items())]
    return "\n".join(
        [
            "# API reference\n",
            "Generated from the docstrings at every build (mkdocstrings). Each "
            "page lists every public name of one package: its `__all__`, or "
            "what its `__init__` imports where it has none.\n",
            "| package | summary |\n| --- | --- |",
            *rows,
            "",
            "Not documented here:\n",
            *excluded,
            "",
        ]
    )


def pages():
    """`{path inside docs/: Markdown}` of every API reference page."""
    package = _load()
    result = {f"{API_DIR}/index.md": index_page(package)}
    result[f"{API_DIR}/{PACKAGE}.md"] = top_level_page(package)
    for name in subpackages():
        result[f"{API_DIR}/{name}.md"] = subpackage_page(name, package)
    return result


def on_files(files, config):
    for src_uri, content in pages().items():
        files.append(File.generated(config, src_uri, content=content))
    return files
