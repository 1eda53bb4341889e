"""The book's device rule, checked in every chapter's code cells.

A chapter's GPU work runs on ``device`` (``BOOK_DEVICE=cuda:1`` must be right), so a call
that acts on the *current* GPU, or on a GPU named by a literal, is a bug waiting for a second GPU:

- ``torch.cuda.synchronize()`` and ``torch.accelerator.synchronize()`` wait for the current
  GPU only; pass the device. ``synchronize(0)`` waits for GPU 0, whatever ``device`` is.
- ``torch.cuda.current_stream()`` is the current GPU's stream; pass the device.
- ``event.record()`` records on the current GPU's current stream, and a bare ``event.wait()``
  makes the current GPU's current stream wait; pass the stream.
- The memory statistics, ``torch.cuda.Stream()``, ``default_stream()``, the device queries and
  ``torch.cuda.get_rng_state()`` ask about (or create on) the current GPU; pass the device.
- ``torch.cuda.is_bf16_supported()``, ``initial_seed()``, ``manual_seed()``, ``seed()`` and
  ``_sleep()`` take no device at all: call them inside ``with torch.cuda.device(device):``.
- ``x.cuda()`` and the literals ``"cuda"`` and ``"cuda:0"`` as a device put work on the current
  GPU or on GPU 0 instead of ``device``; ``.to(device)`` follows the chapter's device.

A call on the current GPU is fine inside ``with torch.cuda.device(...):`` (or
``torch.cuda.stream(...)``), which makes the named GPU the current one; a literal GPU number
never is. ``ALLOWED`` lists the remaining exceptions, each with its reason.

``torch.cuda.is_available()`` says whether *this machine* has a GPU, not whether the chapter
uses one: a cell that works on ``device`` and decides anything with it (an ``if``, a conditional
expression, ``pin_memory=``, a variable holding its answer) is wrong with ``BOOK_DEVICE=cpu`` on
a GPU machine. Test ``device.type`` instead.

Chapters also create scratch folders with ``tempfile.TemporaryDirectory`` (removed when done),
never ``tempfile.mkdtemp``, which leaves them in the temporary folder after every run.

Names imported from ``torch.cuda`` (``from torch.cuda import synchronize``) and module aliases
(``import torch.cuda as tc``) are followed, across the cells of one chapter.
"""

from __future__ import annotations

import ast
import re

import nbformat
import pytest

from tests.conftest import ROOT

CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))

#: (chapter file name, call as written) -> why it may act on the current device there.
_NAME_ONLY = "a torch.device is only a name: creating one touches no GPU (chapter 1 teaches the names)"
ALLOWED: dict[tuple[str, str], str] = {
    ("01_devices.ipynb", "torch.device('cuda:0')"): _NAME_ONLY,
    ("01_devices.ipynb", "torch.device('cuda:1')"): _NAME_ONLY,
    ("01_devices.ipynb", "torch.device('cuda')"): _NAME_ONLY + "; the hand-written choice of a "
    "device type, compared by type only",
    ("01_devices.ipynb", "torch.cuda.get_device_name(1)"): "CUDA_VISIBLE_DEVICES renumbers the "
    "machine's second GPU as cuda:0 in a child process, compared with this process's cuda:1; "
    "reading the name creates no CUDA context",
    ("07_data_parallel.ipynb", "torch.device('cuda:0')"): "the tutorial's function, called with "
    "n_gpus=1, never uses the device: the cell shows that it leaves the model on the CPU",
}

_MEMORY = ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved",
           "reset_peak_memory_stats", "memory_stats")

#: Function -> position of its device (or stream) argument; None: it takes no device and acts
#: on the current GPU, so only a `with torch.cuda.device(...)` block can aim it.
_DEVICE_ARG: dict[str, int | None] = {
    "torch.cuda.synchronize": 0,
    "torch.accelerator.synchronize": 0,
    "torch.cuda.current_stream": 0,
    "torch.cuda.default_stream": 0,
    "torch.cuda.Stream": 0,
    "torch.cuda.get_rng_state": 0,
    "torch.cuda.set_rng_state": 1,
    "torch.cuda.is_bf16_supported": None,
    "torch.cuda.initial_seed": None,
    "torch.cuda.manual_seed": None,
    "torch.cuda.seed": None,
    "torch.cuda._sleep": None,
    **{f"torch.cuda.{f}": 0 for f in (*_MEMORY, "memory_summary", "mem_get_info", "get_device_name",
                                      "get_device_properties", "get_device_capability")},
    **{f"torch.accelerator.{f}": 0 for f in _MEMORY},
}
_DEVICE_KEYWORDS = ("device", "device_index", "stream")
_AVAILABLE = ("torch.cuda.is_available", "torch.accelerator.is_available")
_DEVICE_BLOCKS = ("torch.cuda.device", "torch.accelerator.device_index", "torch.cuda.stream")
_GPU_LITERAL = re.compile(r"cuda(:\d+)?")
_WITH_BLOCK = "it takes no device: call it inside `with torch.cuda.device(device):`"


def _code(source: str) -> str:
    # IPython magics and shell lines are not Python; blank them, keeping line numbers.
    return "\n".join("" if re.match(r"\s*[%!]", line) else line for line in source.splitlines())


class _Chapter:
    """What one chapter's cells define for the later ones: import aliases, names holding
    is_available()'s answer, and names holding events."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        self.availability: set[str] = set()
        self.events: set[str] = set()


class _Finder(ast.NodeVisitor):
    def __init__(self, chapter: _Chapter | None = None) -> None:
        self.chapter = chapter or _Chapter()
        self.problems: list[tuple[int, str, str]] = []
        self._device_blocks = 0

    # -- names ------------------------------------------------------------------------
    def name(self, node: ast.AST) -> str:
        """'torch.cuda.synchronize' for torch.cuda.synchronize (or an imported alias of it)."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return ""
        parts.append(self.chapter.aliases.get(node.id, node.id))
        return ".".join(reversed(parts))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.chapter.aliases[alias.asname] = alias.name

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.module.split(".")[0] == "torch":
            for alias in node.names:
                self.chapter.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def _asks_availability(self, node: ast.AST) -> bool:
        return any(
            (isinstance(n, ast.Call) and self.name(n.func) in _AVAILABLE)
            or (isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                and n.id in self.chapter.availability)
            for n in ast.walk(node)
        )

    def _is_answer(self, node: ast.AST) -> bool:
        """True for `torch.cuda.is_available()`, `not on_gpu and n > 1`, ...: a value that
        holds the machine's answer (`y = x.to(device) if ... else x` does not)."""
        if isinstance(node, ast.Call):
            return self.name(node.func) in _AVAILABLE
        if isinstance(node, ast.Name):
            return node.id in self.chapter.availability
        if isinstance(node, ast.UnaryOp):
            return self._is_answer(node.operand)
        if isinstance(node, ast.BoolOp):
            return any(self._is_answer(v) for v in node.values)
        if isinstance(node, ast.Compare):
            return any(self._is_answer(v) for v in (node.left, *node.comparators))
        return False

    def _flag(self, node: ast.AST, call: str, fix: str) -> None:
        self.problems.append((node.lineno, call, fix))

    # -- statements -------------------------------------------------------------------
    def visit_With(self, node: ast.With) -> None:
        names = [self.name(item.context_expr.func) for item in node.items
                 if isinstance(item.context_expr, ast.Call)]
        chosen = any(name in _DEVICE_BLOCKS for name in names)
        for item in node.items:
            self.visit(item)
        self._device_blocks += chosen
        for statement in node.body:
            self.visit(statement)
        self._device_blocks -= chosen

    def visit_Assign(self, node: ast.Assign) -> None:
        targets = [n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        if self._is_answer(node.value):
            self.chapter.availability.update(targets)
        if isinstance(node.value, ast.Call) and self.name(node.value.func).endswith(("Event", "record_event")):
            self.chapter.events.update(targets)
        self._simple(node)

    def _branch(self, node: ast.If | ast.IfExp | ast.While) -> None:
        parts = node.body + node.orelse if isinstance(node.body, list) else [node.body, node.orelse]
        if self._asks_availability(node.test) and _uses_device(parts):
            word = "while" if isinstance(node, ast.While) else "if"
            self._flag(node, f"{word} {ast.unparse(node.test)}:",
                       "the branch works on `device`: test device.type instead")

    def visit_If(self, node: ast.If) -> None:
        self._branch(node)
        self.generic_visit(node)

    visit_While = visit_If

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._branch(node)
        self.generic_visit(node)

    def _simple(self, node: ast.stmt) -> None:
        # A statement that both works on `device` and asks whether the machine has a GPU,
        # such as `x = x.to(device, non_blocking=torch.cuda.is_available())`.
        if not any(isinstance(n, ast.IfExp) for n in ast.walk(node)) and \
                self._asks_availability(node) and _uses_device([node]):
            self._flag(node, ast.unparse(node).splitlines()[0],
                       "this works on `device`: test device.type, not whether the machine has a GPU")
        self.generic_visit(node)

    visit_Expr = visit_AugAssign = visit_AnnAssign = visit_Return = visit_Assert = _simple

    # -- calls ------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        name = self.name(node.func)
        method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
        outside = not self._device_blocks
        if name in _DEVICE_ARG:
            self._device_call(node, name)
        elif method == "record" and not node.args and not node.keywords and outside:
            self._flag(node, f"{ast.unparse(node.func)}()",
                       "pass the stream: event.record(torch.cuda.current_stream(device))")
        elif method == "wait" and not node.args and not node.keywords and outside and (
                self.name(node.func.value) in self.chapter.events
                or (isinstance(node.func.value, ast.Call)
                    and self.name(node.func.value.func).endswith("Event"))):
            self._flag(node, f"{ast.unparse(node.func)}()",
                       "pass the stream that must wait: event.wait(torch.cuda.current_stream(device))")
        elif method == "cuda" and name not in _DEVICE_ARG:
            literal = node.args and isinstance(node.args[0], ast.Constant)
            if literal or (not node.args and not node.keywords and outside):
                self._flag(node, f"{ast.unparse(node)}",
                           "use .to(device): .cuda() picks the current GPU (or a fixed one)")
        elif name != "print" and not (name == "torch.device" and len(node.args) > 1):
            # torch.device("cuda", i) names its GPU; print() only shows text.
            self._literals(node, name)
        for keyword in node.keywords:
            if keyword.arg in ("pin_memory", "non_blocking") and self._asks_availability(keyword.value):
                self._flag(node, f"{keyword.arg}={ast.unparse(keyword.value)}",
                           "pin only for a CUDA device: pin_memory=device.type == 'cuda'")
        if name == "tempfile.mkdtemp":
            self._flag(node, "tempfile.mkdtemp()", "use tempfile.TemporaryDirectory() and clean it up")
        self.generic_visit(node)

    def _device_call(self, node: ast.Call, name: str) -> None:
        position = _DEVICE_ARG[name]
        given = [k.value for k in node.keywords if k.arg in _DEVICE_KEYWORDS]
        if position is not None and len(node.args) > position:
            given.append(node.args[position])
        if not given:
            if not self._device_blocks:
                fix = _WITH_BLOCK if position is None else f"pass the device: {name}(device)"
                self._flag(node, f"{name}()", fix)
            return
        value = given[0]
        if isinstance(value, ast.Constant) and (
                isinstance(value.value, int)
                or (isinstance(value.value, str) and _fixed_gpu(value.value, self._device_blocks))):
            self._flag(node, f"{name}({value.value!r})",
                       f"a fixed GPU, not the chapter's: {name}(device)")

    def _literals(self, node: ast.Call, name: str) -> None:
        values = [("", v) for v in node.args]
        values += [(f"{k.arg}=", k.value) for k in node.keywords if k.arg not in (None, "device_type")]
        for label, value in values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str) and \
                    _fixed_gpu(value.value, self._device_blocks):
                self._flag(node, f"{name or ast.unparse(node.func)}({label}{value.value!r})",
                           "name the chapter's device (device), not the current GPU or GPU 0")


def _fixed_gpu(text: str, in_device_block: int) -> bool:
    """True for "cuda:N" anywhere, and for "cuda" (the current GPU) outside a device block."""
    if not _GPU_LITERAL.fullmatch(text):
        return False
    return ":" in text or not in_device_block


def _uses_device(body: list[ast.AST]) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "device" for s in body for n in ast.walk(s))


def _problems(path) -> list[tuple[int, int, str, str]]:
    """(cell index, line, call as written, fix) for every breach in one chapter."""
    chapter = _Chapter()
    found = []
    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        finder = _Finder(chapter)
        finder.visit(ast.parse(_code(cell.source)))
        found += [(index, line, call, fix) for line, call, fix in finder.problems]
    return found


def violations(path) -> list[str]:
    """Every breach of the device rule in one chapter, as 'file cell N line L: call (fix)'."""
    return [f"{path.name} cell {index} line {line}: {call} ({fix})"
            for index, line, call, fix in _problems(path) if (path.name, call) not in ALLOWED]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_follows_the_device_rule(path):
    found = violations(path)
    assert not found, "\n".join(found)


def test_allowed_exceptions_still_exist():
    every = {(p.name, call) for p in CHAPTERS for _, _, call, _ in _problems(p)}
    stale = [key for key in ALLOWED if key not in every]
    assert not stale, f"allowed exceptions that no chapter needs any more: {stale}"


BAD = '''
import tempfile, torch
from torch.cuda import synchronize as sync
import torch.cuda as tc
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
sync()
tc.synchronize()
torch.cuda.synchronize(0)
loader = DataLoader(data, pin_memory=torch.cuda.is_available())
x = x.to(device, non_blocking=torch.cuda.is_available())
y = x.to(device) if torch.cuda.is_available() else x
on_gpu = torch.cuda.is_available()
if on_gpu:
    y = x.to(device)
seed = torch.cuda.initial_seed()
torch.cuda.manual_seed(0)
state = torch.cuda.get_rng_state()
start.wait()
torch.cuda._sleep(1000)
ok = torch.cuda.is_bf16_supported(False)
g = torch.zeros(3).cuda()
z = torch.zeros(3, device="cuda")
w = x.to("cuda:0")
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
    seed = torch.cuda.initial_seed()
    torch.cuda._sleep(1000)
    ok = torch.cuda.is_bf16_supported()
    g = torch.zeros(3).cuda()
    z = torch.zeros(3, device="cuda")
with torch.cuda.stream(copies):
    torch.cuda.current_stream().synchronize()
with tempfile.TemporaryDirectory() as folder:
    pass
if torch.cuda.is_available():
    print(torch.cuda.device_count())
if device.type == "cuda":
    torch.cuda.synchronize(device)
loader = DataLoader(data, pin_memory=device.type == "cuda")
done = torch.cuda.Event()
done.wait(s)
state = torch.cuda.get_rng_state(device)
name = torch.device("cuda", 1)
process.wait()
print("cuda")
kind = torch.autocast(device_type="cuda")
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
        "torch.cuda.synchronize()",
        "torch.cuda.synchronize()",
        "torch.cuda.synchronize(0)",
        "pin_memory=torch.cuda.is_available()",
        "x = x.to(device, non_blocking=torch.cuda.is_available())",
        "non_blocking=torch.cuda.is_available()",
        "if torch.cuda.is_available():",
        "if on_gpu:",
        "torch.cuda.initial_seed()",
        "torch.cuda.manual_seed()",
        "torch.cuda.get_rng_state()",
        "start.wait()",
        "torch.cuda._sleep()",
        "torch.cuda.is_bf16_supported()",
        "torch.zeros(3).cuda()",
        "torch.zeros(device='cuda')",
        "x.to('cuda:0')",
    ], bad
    assert violations(tmp_path / "good.ipynb") == []


def test_imports_and_answers_carry_across_cells(tmp_path):
    cells = ["from torch.cuda import current_stream\ncuda_ok = torch.cuda.is_available()",
             "s = current_stream()\nif cuda_ok:\n    x = x.to(device)"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbformat.write(nb, tmp_path / "two.ipynb")
    found = violations(tmp_path / "two.ipynb")
    assert [entry.split(": ", 1)[1].split(" (")[0] for entry in found] == [
        "torch.cuda.current_stream()", "if cuda_ok:"], found
