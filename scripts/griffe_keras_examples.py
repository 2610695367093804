"""Griffe extension: Keras-style docstrings read as Google style.

Loaded by mkdocstrings for the API reference (mkdocs.yml); the docstrings
themselves stay as they are. Two differences:

- Arguments documented together, their names over two lines
  (`model, data, passes,` then `    seed: as in ...`): the names are put
  on one line, which Griffe reads as one entry (else it drops the entry).
- Keras writes an example as a title, a blank line, and an unindented
  block:

      Example:

      >>> layer = CellRNN(RLSTMCell(16), return_sequences=True)

  Griffe's Google parser wants a section's body indented right under its
  title; without it the `>>>` lines would render as nested block quotes.
  The block is indented, up to the next section title after a blank line
  or the end, so that it renders as code.
"""

import re

import griffe

_EXAMPLE_TITLE = re.compile(r"^Examples?:\s*$")
_SECTION_TITLE = re.compile(r"^[A-Z][\w ]*:\s*$")
_NAMES_GO_ON = re.compile(r"^\s+\w+(, *\w+)*,\s*$")  # "    model, data, passes,"


def join_argument_names(text):
    """Returns `text` with argument names listed over two lines on one."""
    lines = text.split("\n")
    out = []
    for line in lines:
        if out and _NAMES_GO_ON.match(out[-1]) and line.strip():
            out[-1] = out[-1].rstrip() + " " + line.strip()
        else:
            out.append(line)
    return "\n".join(out)


def keras_examples_to_google(text):
    """Returns `text` with each Keras-style `Example:` block indented."""
    lines = text.split("\n")
    out = []
    index = 0
    while index < len(lines):
        line = lines[index]
        next_blank = index + 1 < len(lines) and not lines[index + 1].strip()
        if not (_EXAMPLE_TITLE.match(line) and next_blank):
            out.append(line)
            index += 1
            continue
        out.append("Examples:")
        index += 2  # the title and the blank line below it
        while index < len(lines):
            line = lines[index]
            after_blank = not lines[index - 1].strip()
            if after_blank and _SECTION_TITLE.match(line):
                break
            out.append("    " + line if line.strip() else "")
            index += 1
    return "\n".join(out)


class KerasExamples(griffe.Extension):
    def on_instance(self, *, obj, **kwargs):
        if obj.docstring is not None:
            text = join_argument_names(obj.docstring.value)
            obj.docstring.value = keras_examples_to_google(text)
