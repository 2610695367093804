"""The guides' code blocks, found and read with their markers.

Every ```python and ```bash (```sh, ```shell) block of README.md and of the
pages docs/*.md (not the measurement records docs/results*) carries an HTML
comment on the line before it (blank lines may come between) that says
whether the suite runs it (docs_blocks_test.py; docs/testing.md, "The
guides' code blocks"):

    <!-- not run: trains for hours on PTB -->

    <!-- run -->

    <!-- run
    files: notes.txt
    given: model = km.LanguageModel(50, units=8, batch_size=4)
    replace: "units=650" -> "units=8", "epochs=13" -> "epochs=1"
    then: assert log_p.shape == (3, 7, 50)
    -->

`not run:` needs a reason. `run` may be followed by clauses, one a line:
- `files:` paths (space-separated) that get a tiny synthetic text (the
  embedded grammar's sentences) in the block's working directory, a fresh
  temporary one per page, before the page's first block runs;
- `given:` a line of Python run before the block, in its namespace, for the
  names the page assumes (a trained `model`, `input_dim`);
- `replace:` `"old" -> "new"` pairs, applied to the block's text in order;
  each must find its `old` (else the block fails to parse);
- `then:` a line of Python run after it, in its namespace: a check;
- `by:` the test file that runs the block instead of the harness (with the
  block's replacements, `block_code`), then free text.
A line starting with `#` is a comment (why a clause is there).
"""

import dataclasses
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]

LANGUAGES = {"python": "python", "py": "python", "python3": "python",
             "bash": "shell", "sh": "shell", "shell": "shell", "zsh": "shell"}
CLAUSES = ("files", "given", "replace", "then", "by")

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)[^`]*$")
_PAIR = re.compile(r'\s*"((?:[^"\\]|\\.)*)"\s*->\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


class MarkerError(ValueError):
    """A block's marker is missing or cannot be read; the message says where."""


@dataclasses.dataclass
class Marker:
    line: int  # 1-based line of the comment's first line
    reason: str = None  # `not run:`; None when the block runs
    files: list = dataclasses.field(default_factory=list)
    given: list = dataclasses.field(default_factory=list)
    replace: list = dataclasses.field(default_factory=list)
    then: list = dataclasses.field(default_factory=list)
    by: str = None

    @property
    def runs(self):
        return self.reason is None


@dataclasses.dataclass
class Block:
    page: str  # relative to the repository, e.g. "docs/data.md"
    line: int  # 1-based line of the opening fence
    language: str  # "python" or "shell"
    code: str
    marker: Marker = None
    error: str = None  # why the marker could not be read

    @property
    def where(self):
        return f"{self.page}:{self.line}"


def guide_pages(root=ROOT):
    """README.md and docs/*.md, except the measurement records docs/results*."""
    root = pathlib.Path(root)
    docs = sorted(p for p in (root / "docs").glob("*.md") if not p.name.startswith("results"))
    return [root / "README.md", *docs]


def page_blocks(path, root=ROOT):
    """The page's Python and shell blocks, each with its marker (or error)."""
    path = pathlib.Path(path)
    page = path.relative_to(root).as_posix() if path.is_absolute() else path.as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        end = i + 1
        while end < len(lines) and not re.match(
            rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[end]
        ):
            end += 1
        language = LANGUAGES.get(m["info"].lower())
        if language:
            code = "\n".join(line[indent:] if line[:indent].strip() == "" else line
                             for line in lines[i + 1:end]) + "\n"
            block = Block(page, i + 1, language, code)
            try:
                block.marker = _marker_before(lines, i, block.where)
                if block.marker.runs:
                    block_code(block)  # every replacement must apply
            except MarkerError as e:
                block.error = str(e)
            found.append(block)
        i = end + 1
    return found


def all_blocks(root=ROOT):
    return [b for page in guide_pages(root) for b in page_blocks(page, root)]


def blocks_run_by(test_file, root=ROOT):
    """The blocks whose marker says `by: test_file` (relative to the repository)."""
    return [b for b in all_blocks(root)
            if b.error is None and b.marker.runs and b.marker.by == test_file]


def block_code(block):
    """The block's text after its marker's replacements (each must apply)."""
    code = block.code
    for old, new in block.marker.replace:
        if old not in code:
            raise MarkerError(
                f"{block.where}: the marker's replacement {old!r} -> {new!r} finds "
                f"nothing to replace in the block"
            )
        code = code.replace(old, new)
    return code


def _marker_before(lines, fence_index, where):
    j = fence_index - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j < 0 or not lines[j].strip().endswith("-->"):
        raise MarkerError(
            f"{where}: the block has no marker: put `<!-- run -->` (with `given:`, "
            f"`replace:`, ... as needed) or `<!-- not run: REASON -->` on the line "
            f"before it"
        )
    end = j
    while j >= 0 and "<!--" not in lines[j]:
        j -= 1
    if j < 0:
        raise MarkerError(f"{where}: a `-->` before the block without its `<!--`")
    text = "\n".join(lines[j:end + 1]).strip()
    body = text[text.index("<!--") + 4:text.rindex("-->")].strip()
    return parse_marker(body, j + 1, where)


def parse_marker(body, line, where):
    marker = Marker(line)
    if body.startswith("not run"):
        reason = body[len("not run"):].lstrip()
        if not reason.startswith(":") or not reason[1:].strip():
            raise MarkerError(f"{where}: `not run` needs a reason: `<!-- not run: REASON -->`")
        marker.reason = " ".join(reason[1:].split())
        return marker
    first, *rest = body.splitlines() or [""]
    if first.strip() != "run" and not first.startswith("run "):
        raise MarkerError(
            f"{where}: the comment before the block is not a marker; it must start with "
            f"`run` or `not run:` (found {first[:60]!r})"
        )
    clauses = [first[4:]] + rest if first.startswith("run ") else rest
    for clause in (c.strip() for c in clauses):
        if not clause or clause.startswith("#"):  # a comment: why a clause is there
            continue
        name, _, value = clause.partition(":")
        if name not in CLAUSES or not value.strip():
            raise MarkerError(
                f"{where}: cannot read the marker's clause {clause[:60]!r}; expected one of "
                + ", ".join(f"`{c}: ...`" for c in CLAUSES)
            )
        value = value.strip()
        if name == "files":
            marker.files += value.split()
        elif name == "replace":
            marker.replace += _pairs(value, where)
        elif name == "by":
            path = value.split()[0]
            if not (ROOT / path).is_file():
                raise MarkerError(f"{where}: `by: {path}`: no such test file")
            marker.by = path
        else:
            getattr(marker, name).append(value)
    return marker


def _pairs(text, where):
    pairs, pos = [], 0
    while pos < len(text):
        m = _PAIR.match(text, pos)
        if not m:
            raise MarkerError(
                f"{where}: cannot read `replace: {text[pos:pos + 60]}`; expected "
                f'`"old" -> "new"` pairs separated by commas'
            )
        pairs.append(tuple(s.replace('\\"', '"') for s in m.groups()))
        pos = m.end()
    return pairs
