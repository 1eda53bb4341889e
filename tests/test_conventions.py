"""The book's device rule, checked in every chapter's code cells.

A chapter's GPU work runs on ``device`` (``BOOK_DEVICE=cuda:1`` must be right), so a call
that acts on the *current* GPU without naming one is a bug waiting for a second GPU:

- ``torch.cuda.synchronize()`` and ``torch.accelerator.synchronize()`` wait for the current
  GPU only; pass the device.
- ``torch.cuda.current_stream()`` is the current GPU's stream; pass the device.
- ``event.record()`` records on the current GPU's current stream; pass the stream.
- The memory statistics, ``torch.cuda.Stream()``, ``default_stream()``, ``is_bf16_supported()``
  and the device queries ask about (or create on) the current GPU; pass the device.

Such a call is fine inside ``with torch.cuda.device(...):``, which makes the named GPU the
current one. ``ALLOWED`` lists the remaining exceptions, each with its reason.

A cell that branches on ``torch.cuda.is_available()`` and then works on ``device`` is wrong
with ``BOOK_DEVICE=cpu`` on a GPU machine: branch on ``device.type`` instead.

Chapters also create scratch folders with ``tempfile.TemporaryDirectory`` (removed when done),
never ``tempfile.mkdtemp``, which leaves them in the temporary folder after every run.
"""

from __future__ import annotations

import ast
import re

import nbformat
import pytest

from tests.conftest import ROOT

CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))

#: (chapter file name, call as written) -> why it may act on the current device there.
ALLOWED: dict[tuple[str, str], str] = {}

_NO_DEVICE_CALLS = {
    "torch.cuda.synchronize": "pass the device: torch.cuda.synchronize(device)",
    "torch.accelerator.synchronize": "pass the device: torch.accelerator.synchronize(device)",
    "torch.cuda.current_stream": "pass the device: torch.cuda.current_stream(device)",
}
# Queries and objects that take a device and otherwise use the current one.
_NO_DEVICE_CALLS.update({
    f"torch.{module}.{function}": f"pass the device: torch.{module}.{function}(device)"
    for module, functions in {
        "cuda": ("default_stream", "Stream", "memory_allocated", "memory_reserved",
                 "max_memory_allocated", "max_memory_reserved", "reset_peak_memory_stats",
                 "memory_stats", "memory_summary", "mem_get_info", "is_bf16_supported",
                 "get_device_name", "get_device_properties", "get_device_capability"),
        "accelerator": ("memory_allocated", "memory_reserved", "max_memory_allocated",
                        "max_memory_reserved", "reset_peak_memory_stats", "memory_stats"),
    }.items()
    for function in functions
})


def _name(node: ast.AST) -> str:
    """'torch.cuda.synchronize' for the expression torch.cuda.synchronize, '' if not a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _code(source: str) -> str:
    # IPython magics and shell lines are not Python; blank them, keeping line numbers.
    return "\n".join("" if re.match(r"\s*[%!]", line) else line for line in source.splitlines())


class _Finder(ast.NodeVisitor):
    def __init__(self) -> None:
        self.problems: list[tuple[int, str, str]] = []
        self._device_blocks = 0

    def visit_With(self, node: ast.With) -> None:
        names = [_name(item.context_expr.func) for item in node.items
                 if isinstance(item.context_expr, ast.Call)]
        chosen = any(name in ("torch.cuda.device", "torch.accelerator.device_index") for name in names)
        for item in node.items:
            self.visit(item)
        self._device_blocks += chosen
        for statement in node.body:
            self.visit(statement)
        self._device_blocks -= chosen

    def visit_Call(self, node: ast.Call) -> None:
        # Every call checked here takes the device (or stream) first, or as device=/stream=.
        bare = not node.args and not any(k.arg in ("device", "stream") for k in node.keywords)
        name = _name(node.func)
        if bare and not self._device_blocks:
            if name in _NO_DEVICE_CALLS:
                self.problems.append((node.lineno, f"{name}()", _NO_DEVICE_CALLS[name]))
            elif isinstance(node.func, ast.Attribute) and node.func.attr == "record":
                self.problems.append((node.lineno, f"{ast.unparse(node.func)}()",
                                      "pass the stream: event.record(torch.cuda.current_stream(device))"))
        if name == "tempfile.mkdtemp":
            self.problems.append((node.lineno, "tempfile.mkdtemp()",
                                  "use tempfile.TemporaryDirectory() and clean it up"))
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        test = ast.unparse(node.test)
        if "torch.cuda.is_available()" in test and _uses_device(node.body):
            self.problems.append((node.lineno, f"if {test}:",
                                  "the branch works on `device`: test device.type instead"))
        self.generic_visit(node)


def _uses_device(body: list[ast.stmt]) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "device" for s in body for n in ast.walk(s))


def violations(path) -> list[str]:
    """Every breach of the device rule in one chapter, as 'file cell N line L: call (fix)'."""
    found = []
    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        finder = _Finder()
        finder.visit(ast.parse(_code(cell.source)))
        for line, call, fix in finder.problems:
            if (path.name, call) not in ALLOWED:
                found.append(f"{path.name} cell {index} line {line}: {call} ({fix})")
    return found


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_follows_the_device_rule(path):
    found = violations(path)
    assert not found, "\n".join(found)


def test_allowed_exceptions_still_exist():
    every = {(p.name, call) for p in CHAPTERS for call in _calls(p)}
    stale = [key for key in ALLOWED if key not in every]
    assert not stale, f"allowed exceptions that no chapter needs any more: {stale}"


def _calls(path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    calls = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            finder = _Finder()
            finder.visit(ast.parse(_code(cell.source)))
            calls += [call for _, call, _ in finder.problems]
    return calls


BAD = '''
import tempfile, torch
torch.cuda.synchronize()
s = torch.cuda.current_stream()
peak = torch.cuda.max_memory_allocated()
print(torch.cuda.memory_summary(abbreviated=True))
torch.cuda.Event(enable_timing=True).record()
start = torch.cuda.Event()
start.record()
folder = tempfile.mkdtemp()
if torch.cuda.is_available():
    x = torch.ones(1, device=device)
'''

GOOD = '''
import tempfile, torch
torch.cuda.synchronize(device)
s = torch.cuda.current_stream(device)
peak = torch.cuda.max_memory_allocated(device)
copies = torch.cuda.Stream(device=device)
print(torch.cuda.memory_summary(device, abbreviated=True))
torch.cuda.Event(enable_timing=True).record(s)
with torch.cuda.device(device):
    torch.cuda.synchronize()
    torch.cuda.Event().record()
with tempfile.TemporaryDirectory() as folder:
    pass
if torch.cuda.is_available():
    print(torch.cuda.device_count())
if device.type == "cuda":
    torch.cuda.synchronize(device)
%time x = 1
'''


def test_the_checker_finds_each_breach(tmp_path):
    for name, source in (("bad.ipynb", BAD), ("good.ipynb", GOOD)):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
        nbformat.write(nb, tmp_path / name)
    bad = violations(tmp_path / "bad.ipynb")
    assert [entry.split(": ", 1)[1].split(" (")[0] for entry in bad] == [
        "torch.cuda.synchronize()",
        "torch.cuda.current_stream()",
        "torch.cuda.max_memory_allocated()",
        "torch.cuda.memory_summary()",
        "torch.cuda.Event(enable_timing=True).record()",
        "start.record()",
        "tempfile.mkdtemp()",
        "if torch.cuda.is_available():",
    ]
    assert violations(tmp_path / "good.ipynb") == []
