"""The modules of the package import one another without a circle."""

import ast
import os

import pytest

import keras_mogrifier

# The package's own source, read as text: the same on every backend.
pytestmark = pytest.mark.once_per_suite

ROOT = os.path.dirname(keras_mogrifier.__file__)


def _module_name(path):
    relative = os.path.relpath(path, os.path.dirname(ROOT))[: -len(".py")]
    parts = relative.split(os.sep)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path, name, modules):
    """The package modules that `path` imports, at any depth of its code
    (a function-level import closes a circle as surely as a top-level one)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m in modules and m != name}


def _graph(subpackage):
    paths = {}
    for directory, _, files in os.walk(os.path.join(ROOT, subpackage)):
        for file in files:
            if file.endswith(".py"):
                path = os.path.join(directory, file)
                paths[_module_name(path)] = path
    return {name: _imports(path, name, paths) for name, path in paths.items()}


def _cycle(graph):
    """A list of modules that import one another in a circle, or None."""
    state = {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, stack)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def test_the_models_package_has_no_import_circle():
    graph = _graph("models")
    assert "keras_mogrifier.models._composition" in graph
    # Package __init__ files re-export their modules: only module-to-module edges.
    graph = {n: {m for m in e if not m.endswith(".models")} for n, e in graph.items()
             if not n.endswith(".models")}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_check_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
