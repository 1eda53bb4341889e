"""The error and warning messages PyTorch and the book's trainers can print on the way between a
reader and a working GPU run, extracted from the installed files (issue 29, step 1).

    python tools/torch_messages.py --python .venv/bin/python --out tests/fixtures/torch-messages.tsv
    python tools/torch_messages.py --python .venv-oldest/bin/python \\
        --out tests/fixtures/torch-messages-oldest.tsv
    python tools/torch_messages.py --python .venv/bin/python --diff tests/fixtures/torch-messages.tsv

``--python`` names the interpreter whose packages are read (it is asked only for its
site-packages folder and the packages' versions; nothing is imported from them). ``--diff FILE``
prints what changed against a file the tool wrote before, and exits 1 if anything did. With a
new torch release: install it in ``.venv``, run the first command, read the diff in git, and
let the troubleshooting page (chapters/09_troubleshooting.md) follow.

**Sources.** The packages of :data:`PACKAGES` (torch, torchvision, Accelerate, Lightning,
torchkeras, torchmetrics, whose metrics the book moves to the GPU, and Triton, which
``torch.compile`` runs on a GPU: its runtime, compiler and backends):

- *Python files* (the folders of :data:`PY_FOLDERS`): every ``raise X(...)``, every warning
  (``warnings.warn``, ``warn``, ``logger.warning``, Lightning's ``rank_zero_warn``...) and every
  ``torch._check*(cond, msg)``. The message is the first argument (or ``msg=``): string
  literals, f-strings, ``+`` and ``%`` and ``.format`` of them, a lambda returning one, or a
  variable assigned one of those a few lines above (``msg = f"..."; raise X(msg)``; one
  message per assignment where branches assign it: ``if c: msg = "a"`` / ``else: msg =
  "b"``), and what an exception class's ``__str__`` returns when that is all it does.
  Each part computed at run time (an f-string field, ``%s``, ``{}``, a variable) is written
  ``{}``. Statements are read one at a time (a statement's lines parsed alone), which is ten
  times faster than parsing every file whole.
- *Compiled libraries* (:data:`LIBRARIES`): the string constants of each library's read-only
  data (``.rodata``) that have the shape of a message: printable, at least four words, not C++
  or an operator's schema. ``printf`` and ``fmt`` placeholders (``%s``, ``%d``, ``{}``) are
  written ``{}``. C++ builds many messages from several constants (``TORCH_CHECK(c, "a ", x,
  " b")``), so a library string may be the first part of a message only.

**Topics.** A message is kept only when it belongs to one of :data:`TOPICS`, the topics issue 29
names, and it is filed under the first that claims it: first by the file it comes from
(:data:`PATH_TOPICS`: a file of ``torch/_inductor/`` is about torch.compile), then by its words
(:data:`WORD_TOPICS`, tried in order: ``NCCL`` is about DDP, ``out of memory`` about memory).
Everything else (shape errors, the JIT, ONNX, sparse tensors...) is left out.

**Entries.** Each message is marked with the labels of the troubleshooting entries that quote
it (read with tests/support.read_entries): an entry quotes a message when its fixed parts
(between the ``{}``), each, are in one of the entry's quoted blocks, in order, and they hold at
least 16 characters in all. ``-`` where no entry quotes it.

**Output.** A tab-separated text file, sorted, one message a line: topic, package, kind (the
exception's class, ``warning``, ``check`` for ``torch._check``, ``library`` for a compiled
string), the files (relative to site-packages; several where the same words appear in
several), the entries, and the message (``\\n``, ``\\t`` and ``\\\\`` escaped). A header of
``#`` lines names the packages' versions, and the counts per topic and per package.
"""

from __future__ import annotations

import argparse
import ast
import bisect
import difflib
import itertools
import json
import re

try:  # Python 3.11 and newer
    import re._constants as _sre
    import re._parser as _sre_parse
except ImportError:  # Python 3.10 (pyproject.toml's oldest)
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]
import struct
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Distributions read, with the import packages (folders of site-packages) they install.
PACKAGES = {"torch": ["torch"], "torchvision": ["torchvision"], "accelerate": ["accelerate"],
            "lightning": ["lightning"], "torchkeras": ["torchkeras"],
            "torchmetrics": ["torchmetrics"], "triton": ["triton"]}

#: The folders of torch whose Python files are read (relative to site-packages): the ones a
#: GPU run goes through. Files directly in torch/ are read too. Left out: the test suite,
#: ONNX, quantisation, the JIT, export, FX, sparse and masked tensors, distributions, and the
#: reference implementations and decompositions of operators (torch/_refs, torch/_decomp).
PY_FOLDERS = ("torch/", "torch/cuda/", "torch/backends/", "torch/amp/", "torch/cpu/",
              "torch/autograd/", "torch/utils/data/", "torch/utils/checkpoint.py",
              "torch/utils/cpp_extension.py", "torch/utils/collect_env.py", "torch/nn/",
              "torch/multiprocessing/", "torch/distributed/", "torch/_dynamo/",
              "torch/_inductor/", "torch/compiler/", "torch/mps/", "torch/xpu/",
              "torch/accelerator/", "torch/_utils.py", "torch/optim/lr_scheduler.py",
              "torchvision/", "accelerate/", "lightning/", "torchkeras/", "torchmetrics/",
              "triton/runtime/", "triton/compiler/", "triton/backends/", "triton/errors.py")
#: Inside those, never read (tests, vendored code, code the user writes: templates).
PY_SKIP = re.compile(r"/(tests?|testing|_vendor|benchmarks?|examples?)/|/test_[^/]*\.py$"
                     r"|^torch/distributed/(_shard|_sharded_tensor|_tools|rpc|pipelining"
                     r"|checkpoint|elastic/rendezvous/etcd)")

#: Compiled libraries of torch (relative to site-packages) whose string constants are read.
LIBRARIES = ("torch/lib/libc10.so", "torch/lib/libc10_cuda.so", "torch/lib/libtorch_cpu.so",
             "torch/lib/libtorch_cuda.so", "torch/lib/libtorch_python.so",
             "torch/lib/libtorch_cuda_linalg.so")

#: The topics issue 29 names, in the order the output lists them.
TOPICS = {
    "device": "devices and drivers: which device, CUDA available or not, ordinals, tensors on "
              "two devices",
    "compat": "wheel and GPU compatibility: compute capability, sm_ architectures, CUDA and "
              "cuDNN versions",
    "memory": "memory: out of memory, the caching allocator and its settings",
    "workers": "DataLoader workers, multiprocessing and shared memory",
    "pinning": "pinned memory and random generators",
    "autograd": "autograd on the GPU: backward, grad_fn, checkpointing",
    "dtypes": "dtypes and their support per GPU generation: half, bfloat16, TF32, fp8",
    "amp": "automatic mixed precision: autocast and GradScaler",
    "distributed": "DDP, NCCL and process groups",
    "compile": "torch.compile: dynamo, inductor, Triton, CUDA graphs",
    "mps": "Apple's GPUs (mps)",
    "xpu": "Intel's GPUs (xpu)",
}

#: Files whose every message belongs to one topic (the first prefix that matches).
PATH_TOPICS = (
    ("torch/mps/", "mps"), ("torch/backends/mps/", "mps"), ("torch/xpu/", "xpu"),
    ("torch/_dynamo/", "compile"), ("torch/_inductor/", "compile"),
    ("torch/compiler/", "compile"), ("torch/cuda/graphs.py", "compile"), ("triton/", "compile"),
    ("torch/distributed/", "distributed"), ("torch/nn/parallel/", "distributed"),
    ("lightning/fabric/strategies/", "distributed"), ("lightning/pytorch/strategies/",
                                                       "distributed"),
    ("torch/amp/", "amp"), ("torch/cuda/amp/", "amp"), ("torch/cpu/amp/", "amp"),
    ("torch/cuda/memory.py", "memory"), ("torch/utils/data/_utils/pin_memory.py", "pinning"),
    ("torch/utils/data/", "workers"), ("torch/multiprocessing/", "workers"),
    ("torch/autograd/", "autograd"), ("torch/utils/checkpoint.py", "autograd"),
    ("torch/utils/cpp_extension.py", "compat"),
)

#: Words that put a message under a topic, tried in this order (the first match wins).
WORD_TOPICS = (
    ("mps", r"\bmps\b|\bMPS|Metal\b|macOS|Apple"),
    ("xpu", r"\bxpu\b|\bXPU\b|Intel GPU|SYCL"),
    ("compile", r"torch\.compile|[Dd]ynamo|[Ii]nductor|[Tt]riton|[Cc]uda ?[Gg]raph|CUDAGraph"
                r"|graph break|[Rr]ecompil"),
    ("distributed", r"NCCL|nccl|ProcessGroup|process.group|DistributedDataParallel|\bDDP\b"
                    r"|world_size|\brank\b|torchrun|accelerate launch|MASTER_ADDR|MASTER_PORT|DataParallel"
                    r"|collective"),
    ("amp", r"autocast|GradScaler|unscale|\bAMP\b|[Mm]ixed precision"),
    ("workers", r"DataLoader|\bworkers?\b|num_workers|shared memory|\bshm|file.descriptor"
                r"|multiprocessing|forked|\bspawn\b|\bfork\b|sharing strategy"),
    ("pinning", r"pin_memory|\bpinned\b|[Pp]in memory|page-locked|[Gg]enerator\b|manual_seed"
                r"|\bRNG\b|rng state"),
    ("memory", r"out of memory|OutOfMemory|\bOOM\b|allocat|expandable_segments|ALLOC_CONF"
               r"|max_split_size|[Mm]em[Pp]ool|memory fraction|memory_fraction"),
    ("compat", r"compute capability|[Cc]apability|\bsm_|arch_list|ARCH_LIST|kernel image|\bPTX"
               r"|CUDA version|cuDNN version|[Cc]ompiled with CUDA|not compiled with|NVRTC"
               r"|nvrtc|CUDA_HOME|nvcc|[Kk]ernel version"),
    ("dtypes", r"[Bb][Ff]loat16|\bbf16\b|[Ff]loat16|\bHalf\b|\bfp16\b|\bfp8\b|[Ff]loat8|TF32"
               r"|tf32|Tensor Cores|float32_matmul_precision"),
    ("autograd", r"grad_fn|requires_grad|\bbackward\b|autograd|retain_graph|leaf Variable"
                 r"|checkpoint"),
    ("device", r"\bCUDA\b|\bcuda\b|cuda:|\bGPU|\bgpu|[Dd]evice|[Dd]river|CUDA_VISIBLE"
               r"|[Aa]ccelerator|NVIDIA|cuDNN|cudnn|cuBLAS|cublas"),
)
_WORDS = [(topic, re.compile(pattern)) for topic, pattern in WORD_TOPICS]
_ANY_TOPIC = re.compile("|".join(pattern for _, pattern in WORD_TOPICS))


def _needles(seq) -> set[str] | None:
    """Strings of which every match of the parsed pattern ``seq`` holds one (the longest run of
    literal characters; one per alternative for a branch), or None when no such set is known."""
    best = run = ""
    branch = None
    for op, av in seq:
        if op is _sre.LITERAL:
            run += chr(av)
            best = max(best, run, key=len)
            continue
        if op is _sre.AT:  # \b and the like take no characters: the run goes on
            continue
        run = ""
        if op is _sre.BRANCH and branch is None:
            alternatives = [_needles(a) for a in av[1]]
            if all(a is not None for a in alternatives):
                branch = set().union(*alternatives)
        elif op is _sre.SUBPATTERN and branch is None and not av[1] & re.IGNORECASE:
            branch = _needles(av[-1])
    return {best} if len(best) >= 2 else branch


#: A quick test that rules out most strings before :data:`_ANY_TOPIC` (a regular expression of
#: about 100 alternatives, slow on the libraries' megabytes of string constants): a string it
#: matches holds one of these (derived from the pattern itself, so they follow any change).
_TOPIC_NEEDLES = None if _ANY_TOPIC.flags & re.IGNORECASE else _needles(
    _sre_parse.parse(_ANY_TOPIC.pattern))
if _TOPIC_NEEDLES is not None:
    _TOPIC_NEEDLES = tuple(sorted(n for n in _TOPIC_NEEDLES
                                  if not any(o != n and o in n for o in _TOPIC_NEEDLES)))


def _any_topic(text: str) -> bool:
    """Whether ``text`` has a topic's words: ``_ANY_TOPIC.search(text)``, only faster."""
    if _TOPIC_NEEDLES is not None and not any(n in text for n in _TOPIC_NEEDLES):
        return False
    return _ANY_TOPIC.search(text) is not None
_NOT_LETTER = re.compile(r"[^A-Za-z ]+")

PLACEHOLDER = "{}"
# printf (%s, %d, %lu, %.2f, %zu...) and fmt/str.format ({} {0} {name} {:.2f}) placeholders.
_FORMAT = re.compile(r"%[-#0 +]*(\d+|\*)?(\.\d+)?(hh|h|ll|l|z|j|t|L)?[diouxXeEfgGcspr]"
                     r"|\{[A-Za-z0-9_.\[\]]*(![rsa])?(:[^{}]*)?\}")
_LETTERS = re.compile(r"[A-Za-z]{2,}")


@dataclass(frozen=True, order=True)
class Message:
    """One message as the output lists it."""

    topic: str
    package: str
    kind: str
    files: str
    entries: str
    text: str


# -- the interpreter's packages ---------------------------------------------------------------

def environment(python: str) -> tuple[Path, dict[str, str]]:
    """``python``'s site-packages folder (the one torch is in) and the versions of
    :data:`PACKAGES` installed there (missing ones left out)."""
    code = ("import importlib.metadata as m, json, sysconfig\n"
            "v = {}\n"
            f"for p in {list(PACKAGES)!r}:\n"
            "    try: v[p] = m.version(p)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps([sysconfig.get_paths()['purelib'], v]))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    site, versions = json.loads(out.stdout)
    return Path(site), versions


# -- messages in Python files -----------------------------------------------------------------

WARN_CALLS = {"warn", "warning", "warn_once", "_warn_once", "rank_zero_warn",
              "rank_zero_deprecation", "rank_zero_info", "warn_explicit", "deprecation_warning"}
CHECK_KINDS = {"_check": "RuntimeError", "_check_value": "ValueError",
               "_check_type": "TypeError", "_check_index": "IndexError",
               "_check_not_implemented": "NotImplementedError",
               "_check_with": "check", "_check_is_size": "RuntimeError"}
# A line that may start a statement we read: raise, a warning call, a torch._check.
_CANDIDATE = re.compile(
    r"^[ \t]*(?:(?:el)?if [^\n]*?:[ \t]*|else:[ \t]*|try:[ \t]*)?(raise\b|[\w.]*(?:"
    + "|".join(sorted(WARN_CALLS | set(CHECK_KINDS))) + r")\(|super\(\)\.__init__\("
    r"|def __str__\()", re.M)
_ASSIGN = r"^[ \t]*{}\s*(?::[^=\n]*)?(\+?=)\s*"
_SCOPE = re.compile(r"(async\s+)?(def|class)\s")
# An exception class (a base named ...Error, ...Exception, ...Warning or ...Resources).
_CLASS = re.compile(r"^[ \t]*class\s+(\w+)\([^)]*(Error|Exception|Warning)\b")


def _statement(lines: list[str], start: int, column: int, limit: int = 60) -> ast.stmt | None:
    """The statement that starts at ``lines[start][column:]``, parsed alone."""
    text = lines[start][column:]
    for end in range(start + 1, min(start + limit, len(lines)) + 1):
        if end > start + 1:
            text += lines[end - 1]
        try:
            tree = ast.parse(text)
        except SyntaxError as exc:
            words = str(exc)
            if ("never closed" in words or "unexpected EOF" in words or "unterminated" in words
                    or "expected an indented block" in words or "EOF" in words):
                continue
            return None
        return tree.body[0] if tree.body else None
    return None


def _text(node: ast.AST | None, resolve) -> str | None:
    """The message an expression builds, its run-time parts written ``{}``; None if it is
    no string at all."""
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v, resolve) or PLACEHOLDER if isinstance(v, ast.Constant)
                       else PLACEHOLDER for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left, resolve), _text(node.right, resolve)
        if left is None and right is None:
            return None
        return (left or PLACEHOLDER) + (right or PLACEHOLDER)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return _text(node.left, resolve)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("format", "strip", "rstrip", "lstrip")):
        return _text(node.func.value, resolve)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "join" and node.args
            and isinstance(node.args[0], (ast.List, ast.Tuple))):
        sep = _text(node.func.value, resolve) or ""
        parts = [_text(e, resolve) for e in node.args[0].elts]
        return sep.join(p or PLACEHOLDER for p in parts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
            "dedent", "str"):
        return _text(node.args[0], resolve) if node.args else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr == "dedent" and node.args:
        return _text(node.args[0], resolve)
    if isinstance(node, ast.Lambda):
        return _text(node.body, resolve)
    if isinstance(node, ast.Name):
        return resolve(node.id)
    return None


def _name(func: ast.AST) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Call):
        return _name(func.func)
    return ""


def _message_of(stmt: ast.stmt, resolve) -> tuple[str, str] | None:
    """(kind, message) of a raise, warning or check statement."""
    node = stmt.value if isinstance(stmt, ast.Expr) else stmt
    if isinstance(stmt, ast.If) and stmt.body:  # `if cond: raise X(...)` on one line
        return _message_of(stmt.body[0], resolve)
    if isinstance(node, ast.Raise):
        exc = node.exc
        if not isinstance(exc, ast.Call):
            return None
        kind = _name(exc.func)
        arg = exc.args[0] if exc.args else next(
            (k.value for k in exc.keywords if k.arg in ("msg", "message")), None)
        text = _text(arg, resolve)
        return (kind, text) if text else None
    if isinstance(node, ast.Call):
        name = _name(node.func)
        if name == "__init__":  # an exception class's own message: super().__init__(msg)
            text = _text(node.args[0], resolve) if node.args else None
            return ("Exception", text) if text else None
        if name in CHECK_KINDS:
            arg = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "msg"), None)
            text = _text(arg, resolve)
            return (CHECK_KINDS[name] if name != "_check_with" else "check", text) \
                if text else None
        if name in WARN_CALLS:
            arg = node.args[0] if node.args else next(
                (k.value for k in node.keywords if k.arg in ("message", "msg")), None)
            text = _text(arg, resolve)
            return ("warning", text) if text else None
    return None


def python_messages(path: Path) -> Iterator[tuple[str, str]]:
    """(kind, message) of each raise, warning and check of a Python file."""
    try:
        source = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    if not _CANDIDATE.search(source):
        return
    lines = source.splitlines(keepends=True)
    starts = [0, *itertools.accumulate(map(len, lines))]

    def indent(number: int) -> int:
        return len(lines[number]) - len(lines[number].lstrip())

    def alternatives(name: str, before: int) -> list[str]:
        # The assignments of `name` above line `before` (within 40 lines, in its function), each
        # with the `+=`s that follow it. One alternative per assignment up to the first that is
        # not inside a branch: `if c: msg = "a"` / `else: msg = "b"` gives both.
        pattern = re.compile(_ASSIGN.format(re.escape(name)))
        level = indent(before)
        outside = False
        found_texts: list[str] = []
        parts: list[str] = []
        for number in range(before - 1, max(before - 40, 0) - 1, -1):
            code = lines[number].strip()
            if code and not code.startswith("#") and indent(number) < level \
                    and code.endswith(":"):
                level = indent(number)  # the enclosing block's header
                outside = outside or _SCOPE.match(code) is not None
            found = pattern.match(lines[number])
            if not found or (outside and indent(number) > level):
                continue  # past the function's start, only its enclosing scope's names count
            stmt = _statement(lines, number, indent(number))
            value = stmt.value if isinstance(
                stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) else None
            text = _text(value, lambda _: None) if value is not None else None
            parts.insert(0, PLACEHOLDER if text is None else text)
            if found[1] == "=":
                found_texts.append("".join(parts))
                parts = []
                if indent(number) <= level:
                    break
        if parts:  # `+=`s with no assignment found above them
            found_texts.append("".join(parts))
        return [t for t in found_texts if _LETTERS.search(t)]

    def chooser(choices: dict[str, list[str]], number: int, choice: int):
        def resolve(name: str) -> str | None:
            if name not in choices:
                choices[name] = alternatives(name, number)
            texts = choices[name]
            return texts[min(choice, len(texts) - 1)] if texts else None
        return resolve

    for found in _CANDIDATE.finditer(source):
        number = bisect.bisect_right(starts, found.start()) - 1
        column = found.start(1) - starts[number]
        stmt = _statement(lines, number, column)
        if stmt is None:
            continue
        if isinstance(stmt, ast.FunctionDef):  # an exception's __str__: its returned message
            if stmt.body and isinstance(stmt.body[0], ast.Return):
                text = _text(stmt.body[0].value, lambda _: None)
                owner = next((lines[n] for n in range(number - 1, -1, -1)
                              if lines[n].strip() and indent(n) < column), "")
                exception = _CLASS.match(owner)  # the class it is in is an exception
                if text and exception:
                    yield exception[1], text
            continue
        # A name assigned in several branches gives one message per assignment.
        choices: dict[str, list[str]] = {}
        for choice in itertools.count():
            result = _message_of(stmt, chooser(choices, number, choice))
            if result:
                yield result
            if choice + 1 >= max(map(len, choices.values()), default=1):
                break


# -- messages in compiled libraries -------------------------------------------------------------

def rodata(path: Path) -> bytes:
    """The read-only data sections of a 64-bit ELF library (its string constants)."""
    with path.open("rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            return b""
        shoff, = struct.unpack_from("<Q", head, 0x28)
        size, count, names_at = struct.unpack_from("<HHH", head, 0x3A)
        f.seek(shoff)
        table = f.read(size * count)

        def section(i: int) -> tuple[int, int, int]:
            name, _, _, _, offset, length = struct.unpack_from("<IIQQQQ", table, i * size)
            return name, offset, length

        _, offset, length = section(names_at)
        f.seek(offset)
        names = f.read(length)
        parts = []
        for i in range(count):
            name, offset, length = section(i)
            if names[name:names.index(b"\0", name)].startswith(b".rodata"):
                f.seek(offset)
                parts.append(f.read(length))
    return b"\0".join(parts)


# A whole string constant: a run of printable characters that a NUL ends (the look-behind
# keeps the search linear: a run is tried from its start only).
_PRINTABLE = re.compile(rb"(?<![\x20-\x7e\t\n])[\x20-\x7e\t\n]{16,}(?=\0)")
# Not a message: C++ and Python source, operator schemas, mangled or file names, docstrings.
_NOT_MESSAGE = re.compile(r"::\w+\(|\(Tensor|Tensor\(|->|\bdef |\bself\.|#include|__global__"
                          r"|\bstd::|template ?<|\n\s*\n|\{\s*$|;\s*$|^[a-z_]+\.[a-z_.]+$"
                          r"|^\w+$|\bArgs:|\bReturns:|\.\. |>>>|\bimport\b")


def library_messages(path: Path) -> Iterator[tuple[str, str]]:
    """("library", message) for each string constant of the library that reads as a message."""
    for found in _PRINTABLE.finditer(rodata(path)):
        text = found.group().decode("ascii")
        if len(text) > 2000 or text.count(" ") < 3 or not _any_topic(text):
            continue
        if len(_NOT_LETTER.sub("", text)) < 0.75 * len(text) or _NOT_MESSAGE.search(text):
            continue
        if len(_LETTERS.findall(text)) < 4:
            continue
        yield "library", text


# -- topics, entries, output ------------------------------------------------------------------

def normalise(text: str) -> str:
    """Placeholders written ``{}``, runs of spaces kept, the ends stripped."""
    text = _FORMAT.sub(PLACEHOLDER, text)
    return text.strip()


def topic_of(file: str, text: str) -> str | None:
    """The topic a message of ``file`` belongs to (:data:`PATH_TOPICS`, then
    :data:`WORD_TOPICS`), or None."""
    for prefix, topic in PATH_TOPICS:
        if file.startswith(prefix):
            return topic
    if not _any_topic(text):
        return None
    for topic, pattern in _WORDS:
        if pattern.search(text):
            return topic
    return None


#: Internal invariants, not messages meant for a reader: C++'s failed internal asserts
#: (``TORCH_INTERNAL_ASSERT``, which say "please report a bug"), and Python's
#: ``raise AssertionError`` (torch's ``assert`` statements, rewritten).
INTERNAL = re.compile(r"INTERNAL ASSERT FAILED|please report a bug to PyTorch")
#: Where ``raise AssertionError`` guards the code's own invariants (torch's ``assert``
#: statements, rewritten): the compiler's and the distributed package's internals. Elsewhere an
#: AssertionError may be meant for the reader ("Torch not compiled with CUDA enabled").
INTERNAL_ASSERTS = ("torch/_inductor/", "torch/_dynamo/", "torch/distributed/")


def is_message(text: str) -> bool:
    """At least three words of fixed text, 16 characters or more, and no internal assert."""
    if INTERNAL.search(text):
        return False
    fixed = text.replace(PLACEHOLDER, " ")
    return len(_LETTERS.findall(fixed)) >= 3 and len(fixed.strip()) >= 16


def _python_files(site: Path, package: str) -> Iterator[Path]:
    for folder in PACKAGES[package]:
        for path in sorted((site / folder).rglob("*.py")):
            rel = path.relative_to(site).as_posix()
            if PY_SKIP.search(rel):
                continue
            if any(rel.startswith(f) if f.endswith("/") else rel == f for f in PY_FOLDERS
                   if f != "torch/") or (rel.startswith("torch/") and rel.count("/") == 1):
                yield path


def extract(site: Path, packages: Iterable[str]) -> dict[tuple[str, str, str, str], set[str]]:
    """{(topic, package, kind, message): files} from the installed packages."""
    found: dict[tuple[str, str, str, str], set[str]] = {}

    def add(package: str, rel: str, kind: str, raw: str) -> None:
        text = normalise(raw)
        if (kind == "AssertionError" and rel.startswith(INTERNAL_ASSERTS)) \
                or not is_message(text):
            return
        topic = topic_of(rel, text)
        if topic:
            found.setdefault((topic, package, kind, text), set()).add(rel)

    for package in packages:
        for path in _python_files(site, package):
            rel = path.relative_to(site).as_posix()
            for kind, text in python_messages(path):
                add(package, rel, kind, text)
        if package == "torch":
            for rel in LIBRARIES:
                if (site / rel).exists():
                    for kind, text in library_messages(site / rel):
                        add(package, rel, kind, text)
    return found


def _fixed_parts(text: str) -> list[str]:
    return [p.strip() for p in text.split(PLACEHOLDER) if p.strip()]


def quoting_entries(text: str, entries: dict[str, list[str]]) -> list[str]:
    """The labels of the entries with a quoted block that holds the message's fixed parts, in
    order (at least 16 characters of them)."""
    parts = _fixed_parts(text)
    if sum(map(len, parts)) < 16:
        return []
    labels = []
    for label, blocks in entries.items():
        for block in blocks:
            at = 0
            for part in parts:
                at = block.find(part, at)
                if at < 0:
                    break
                at += len(part)
            else:
                labels.append(label)
                break
    return labels


def page_entries() -> dict[str, list[str]]:
    """Each troubleshooting entry's quoted blocks (older wordings included), by label."""
    sys.path.insert(0, str(ROOT))
    from tests.support import read_entries

    return {label: e.blocks + [b for blocks in e.older.values() for b in blocks]
            for label, e in read_entries().items()}


def messages(python: str, entries: dict[str, list[str]] | None = None
             ) -> tuple[dict[str, str], list[Message]]:
    """The packages' versions and the sorted messages of the interpreter ``python``."""
    site, versions = environment(python)
    entries = page_entries() if entries is None else entries
    found = extract(site, versions)
    out = []
    for (topic, package, kind, text), files in found.items():
        labels = quoting_entries(text, entries)
        out.append(Message(topic, package, kind, ", ".join(sorted(files)),
                           ",".join(labels) or "-", text))
    order = list(TOPICS)
    out.sort(key=lambda m: (order.index(m.topic), m.package, m.text, m.kind, m.files))
    return versions, out


def escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m[1], m[1]), text)


COLUMNS = ("topic", "package", "kind", "files", "entries", "message")


def render(versions: dict[str, str], found: list[Message]) -> str:
    """The output file's text: a header, then one message a line."""
    topics = Counter(m.topic for m in found)
    packages = Counter(m.package for m in found)
    linked = sum(m.entries != "-" for m in found)
    head = ["# Error and warning messages on the way to a working GPU run, extracted from the",
            "# installed files by tools/torch_messages.py (do not edit: run it again).",
            "# packages: " + ", ".join(f"{p} {v}" for p, v in sorted(versions.items())),
            f"# messages: {len(found)}, quoted by an entry of chapters/09_troubleshooting.md:"
            f" {linked}",
            "# per topic: " + ", ".join(f"{t} {topics[t]}" for t in TOPICS),
            "# per package: " + ", ".join(f"{p} {packages[p]}" for p in sorted(packages)),
            "\t".join(COLUMNS)]
    rows = ["\t".join([m.topic, m.package, m.kind, m.files, m.entries, escape(m.text)])
            for m in found]
    return "\n".join(head + rows) + "\n"


def parse(text: str) -> tuple[dict[str, str], list[Message]]:
    """What :func:`render` wrote: the versions and the messages."""
    versions: dict[str, str] = {}
    found = []
    for line in text.splitlines():
        if line.startswith("# packages: "):
            versions = dict(p.split(" ", 1) for p in line[len("# packages: "):].split(", "))
        elif line and not line.startswith("#") and line != "\t".join(COLUMNS):
            topic, package, kind, files, entries, message = line.split("\t")
            found.append(Message(topic, package, kind, files, entries, unescape(message)))
    return versions, found


def diff(old: str, new: str, old_name: str = "committed", new_name: str = "installed") -> str:
    """A unified diff of two outputs, the counts lines left out."""
    def lines(text: str) -> list[str]:
        return [line for line in text.splitlines()
                if not line.startswith(("# messages:", "# per "))]
    return "\n".join(difflib.unified_diff(lines(old), lines(new), old_name, new_name, n=0,
                                          lineterm=""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter whose installed packages are read")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", type=Path, help="write the messages to this file")
    what.add_argument("--diff", type=Path, help="compare with a file written before")
    args = parser.parse_args(argv)
    text = render(*messages(args.python))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(text.split("\t".join(COLUMNS))[0].rstrip())
        return 0
    changes = diff(args.diff.read_text(), text, str(args.diff), f"{args.python} now")
    print(changes or f"{args.diff}: no change")
    return 1 if changes else 0


if __name__ == "__main__":
    raise SystemExit(main())
