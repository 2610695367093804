"""docs/dynamic-evaluation-any-model.md: its Python blocks run as written.

A block whose first line says `# not run` (with the reason) is skipped.
"""

import pathlib
import re

import pytest

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "dynamic-evaluation-any-model.md"


def python_blocks(text):
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.once_per_suite
def test_the_pages_python_blocks_run_as_written(capsys):
    pytest.importorskip("keras_hub")
    blocks = [b for b in python_blocks(PAGE.read_text()) if "# not run" not in b.splitlines()[0]]
    assert len(blocks) == 1  # the keras-hub example
    namespace = {}
    exec(compile(blocks[0], str(PAGE), "exec"), namespace)
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"static [\d.]+, dynamic [\d.]+", lines[-2])
    assert re.fullmatch(r"LoRA [\d.]+", lines[-1])
    # On a stream that repeats itself, adapting helps.
    static, dynamic = namespace["static"]["perplexity"], namespace["dynamic"]["perplexity"]
    assert dynamic < static
