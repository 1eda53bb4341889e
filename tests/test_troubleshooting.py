"""The troubleshooting index (chapter 9) quotes PyTorch's messages word for word.

Every entry of the page is proven here, by one of two checks, and the page says which:

- *reproduced live*: the message is raised now, with the installed PyTorch, on the CPU, on the
  ``meta`` device (which names ``meta`` where a GPU names ``cuda:0``), through DataLoader workers,
  with a one-process gloo group, or in a spawned subprocess; the page must quote it exactly;
- *found in installed files*: the message cannot be raised without a GPU (or an Apple GPU), so
  its fixed text, cut at the parts that vary (sizes, device numbers), is looked up in the
  files PyTorch installed: the string constants of its compiled libraries, the string literals
  of its Python sources (where the varying parts must meet the template's placeholders), or
  the CUDA runtime's own error strings, asked from ``libcudart`` live.

``tests/test_troubleshooting_gpu.py`` reproduces the CUDA-only and MPS-only messages on such a
machine. A failing check names the entry and prints what PyTorch prints now.
"""

from __future__ import annotations

import argparse
import ast
import ctypes
import dataclasses
import functools
import io
import json
import os
import re
import resource
import socket
import struct
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "chapters" / "09_troubleshooting.md"
SITE = Path(torch.__file__).resolve().parents[1]  # site-packages
TORCH = SITE / "torch"
LIB = TORCH / "lib"
META = torch.device("meta")
MIN_ENTRIES = 45


# -- reading the page -------------------------------------------------------------------------

LABEL = re.compile(r"^\((err-[a-z0-9-]+)\)=$", re.M)
MARK = re.compile(r"^\*Checked with torch (?P<version>[\w.+]+): (?P<how>[^*]+)\*$", re.M)
KINDS = {"reproduced live": "live", "found in installed files": "files"}
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def normalise(text: str) -> str:
    """Trailing spaces and terminal colour codes (bold text) do not count."""
    return "\n".join(line.rstrip() for line in ANSI.sub("", text).strip().splitlines())


@dataclass
class Entry:
    label: str
    group: str
    heading: str
    blocks: list[str]
    version: str
    kind: str
    how: str
    text: str = field(repr=False)
    # Wordings of the oldest supported torch, where it prints the message differently: a block
    # whose paragraph before it ends with "torch X.Y.Z prints:".
    older: dict[str, list[str]] = field(default_factory=dict)


OLDER = re.compile(r"torch (\d+\.\d+\.\d+) prints:$")


def read_entries() -> dict[str, Entry]:
    text = PAGE.read_text()
    found: dict[str, Entry] = {}
    starts = [m.start() for m in LABEL.finditer(text)] + [len(text)]
    for start, end in zip(starts, starts[1:], strict=False):
        chunk = text[start:end]
        label = LABEL.match(chunk).group(1)
        assert label not in found, f"label {label} appears twice"
        groups = re.findall(r"^## (.+)$", text[:start], re.M)
        heading = re.search(r"^### (.+)$", chunk, re.M)
        assert heading, f"[{label}] has no ### heading after its label"
        mark = MARK.search(chunk)
        assert mark, f"[{label}] has no '*Checked with torch X: ...*' line"
        kind = next((k for words, k in KINDS.items() if mark["how"].startswith(words)), None)
        assert kind, f"[{label}] says how it was checked in words the tests do not know"
        blocks: list[str] = []
        older: dict[str, list[str]] = {}
        last = 0
        for block in re.finditer(r"```text\n(.*?)```", chunk, flags=re.S):
            version = OLDER.search(chunk[last:block.start()].strip())
            last = block.end()
            if version:
                older.setdefault(version[1], []).append(normalise(block[1]))
            else:
                blocks.append(normalise(block[1]))
        assert blocks, f"[{label}] quotes no message in a ```text block"
        found[label] = Entry(label, groups[-1] if groups else "", heading[1].strip(), blocks,
                             mark["version"], kind, mark["how"], chunk, older)
    return found


def type_name(cls: type) -> str:
    """How a traceback names an exception class."""
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def line(exc: BaseException) -> str:
    """The end of a traceback: ``ErrorType: message``."""
    return normalise(f"{type_name(type(exc))}: {exc}")


def pinned_torch() -> str:
    match = re.search(r"^torch==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M)
    assert match, "requirements.txt pins no torch"
    return match[1]


def on_pinned_torch() -> bool:
    return torch.__version__.split("+")[0] == pinned_torch()


def oldest_torch() -> str:
    """The oldest torch the book supports, which `make oldest` installs in .venv-oldest."""
    match = re.search(r"^OLDEST_TORCH := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert match, "the Makefile names no OLDEST_TORCH"
    return match[1]


# -- text inside installed files ----------------------------------------------------------------

@functools.cache
def rodata(path: Path) -> bytes:
    """The read-only data sections of an ELF library: where its string constants live."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2, f"{path} is not a 64-bit ELF library"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i: int) -> tuple[int, int, int]:
        name, _, _, _, offset, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        return name, offset, size

    _, names, _ = header(shstrndx)
    parts = []
    for i in range(shnum):
        name_at, offset, size = header(i)
        name = data[names + name_at:data.index(b"\0", names + name_at)]
        if name.startswith(b".rodata"):
            parts.append(data[offset:offset + size])
    return b"\0".join(parts) if parts else data


def pieces(quote: str, variables: list[str]) -> list[str | None]:
    """The quote cut at its varying parts (given in order); None marks each cut."""
    out: list[str | None] = []
    rest = quote
    for value in variables:
        before, sep, rest = rest.partition(value)
        assert sep, f"{value!r} is not in the quoted message (in this order)"
        out += [before, None]
    return out + [rest]


def in_library(path: Path, quote: str, variables: list[str] = ()) -> None:
    """Each fixed piece of the quote, between its varying parts, is in the library's strings.
    C++ builds a message from several literals (``c10::str("a ", x, " b")``), so a piece may
    be the concatenation of consecutive literals. It is covered from the left by the longest
    text that ends a string constant (a NUL follows it) or, at a varying part, meets a
    placeholder of a template (``{}``, ``%s``); every such chunk has at least 4 characters."""
    if not path.exists():
        pytest.skip(f"{path.name} is not part of this PyTorch build")
    data = rodata(path)
    cut = pieces(quote, list(variables))
    for index, piece in enumerate(cut):
        rest = (piece or "").encode()
        shortest = 4 if index == 0 else 2  # a template's tail after a placeholder: ". "
        while rest:
            low, high = 0, len(rest)  # the longest prefix of rest found anywhere
            while low < high:
                mid = (low + high + 1) // 2
                low, high = (mid, high) if rest[:mid] in data else (low, mid - 1)
            ends = (b"\0", b"{", b"%") if low == len(rest) else (b"\0",)
            while low >= min(shortest, len(rest)) and not any(rest[:low] + e in data for e in ends):
                low -= 1
                ends = (b"\0",)
            assert low >= min(shortest, len(rest)), \
                f"{rest.decode()!r} (from {piece!r}) is not in {path.name}"
            shortest = 4
            rest = rest[low:]


PLACEHOLDER = r"(?:\{[^{}]*\}|%[-#0 +]*\d*(?:\.\d+)?[sdifrx])"


@functools.cache
def string_literals(path: Path) -> tuple[str, ...]:
    """Every string literal of a Python file, each f-string field written ``{}``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.JoinedStr):
            out.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(node.value)
    return tuple(out)


def in_source(path: Path, quote: str, variables: list[str] = ()) -> None:
    """A string literal of the file matches the quote, its placeholders ({} fields, %s) standing
    where the quote's varying parts are."""
    assert path.exists(), f"{path} is not installed"
    regex = "".join(PLACEHOLDER if p is None else re.escape(p)
                    for p in pieces(quote, list(variables)))
    pattern = re.compile(regex, re.S)
    assert any(pattern.search(s) for s in string_literals(path)), \
        f"no string literal of {path.name} matches the quote:\n{quote}"


def without_prefix(quote: str, cls: type) -> str:
    prefix = f"{type_name(cls)}: "
    assert quote.startswith(prefix), f"the quote should start with {prefix!r}"
    return quote[len(prefix):]


def nvidia_library(pattern: str) -> ctypes.CDLL:
    """A library of NVIDIA's that the CUDA build of PyTorch installed (its own error texts)."""
    paths = sorted((SITE / "nvidia").glob(f"**/{pattern}"))
    if not paths:
        pytest.skip(f"this PyTorch build installed no {pattern}")
    return ctypes.CDLL(str(paths[0]))


# PyTorch checks every CUDA runtime call with c10::cuda::c10_cuda_check_implementation (the
# C10_CUDA_CHECK macro), which builds the message from the runtime's error code: the runtime's
# own words (cudaGetErrorString, no GPU needed), a help line and, for the errors a kernel reports
# late, the CUDA_LAUNCH_BLOCKING advice. The tests call it with the code a GPU would return.
CUDA_CHECK_SYMBOLS = (
    "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jbPNS0_19CUDAErrorLogCaptureE",  # 2.14
    "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_ib",  # 2.9
)
TERMINATE = "terminate called after throwing an instance of 'c10::AcceleratorError'\n  what():  "
DSA_OMITTED = ("Device-side assertions were explicitly omitted for this error check; the error "
               "probably arose while initializing the DSA handlers.")
DSA_HINT = "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
CUDA_CODES = {"err-device-side-assert": 710, "err-illegal-memory-access": 700,
              "err-no-kernel-image": 209, "err-stream-capture": 900,
              "err-insufficient-driver": 35, "err-invalid-device-ordinal": 101}


def cuda_check_messages(codes: list[int]) -> dict[str, str]:
    """What c10_cuda_check_implementation throws for each error code. It throws a C++ exception
    that ctypes cannot catch, so each call runs in a forked child, whose C++ runtime prints the
    exception as it terminates; the parent reads that from the child's stderr. Call it before
    the process starts threads (it forks)."""
    lib = ctypes.CDLL(str(LIB / "libc10_cuda.so"))
    symbol = next((s for s in CUDA_CHECK_SYMBOLS if hasattr(lib, s)), None)
    assert symbol, "libc10_cuda.so exports no c10_cuda_check_implementation these tests know"
    check = getattr(lib, symbol)
    out = {}
    for code in codes:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: it aborts in check()
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.dup2(write, 2)
            # include_device_assertions=False: True first sets up device-side assertion
            # tracking, which needs a GPU; the message then says so in its last line.
            check(code, b"", b"", 0, False, None)
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as stream:
            text = stream.read().decode(errors="replace")
        os.waitpid(pid, 0)
        out[str(code)] = text
    return out


def cuda_raised(label: str) -> str:
    """The CUDA runtime error of the entry, as PyTorch raises it on a GPU."""
    code = CUDA_CODES[label]
    text = (background()[0]["cuda"] if _background else cuda_check_messages([code]))[str(code)]
    assert TERMINATE in text, f"c10_cuda_check_implementation({code}) printed:\n{text}"
    lines = text.split(TERMINATE)[1].split("\nException raised from ")[0].splitlines()
    assert lines[-1] == DSA_OMITTED, lines
    lines.pop()
    # On a GPU the check asks for device-side assertion tracking; a torch built without it (every
    # release) then adds this hint where it keeps the line (torch 2.9), and nothing where the
    # line is gone from libc10_cuda.so (torch 2.14).
    if DSA_HINT[:-3].encode() in rodata(LIB / "libc10_cuda.so"):
        lines.append(DSA_HINT)
    assert issubclass(torch.AcceleratorError, RuntimeError)
    return f"{type_name(torch.AcceleratorError)}: " + "\n".join(lines)


# -- the checks, one per entry ----------------------------------------------------------------

@dataclass
class Check:
    kind: str
    fn: Callable


CHECKS: dict[str, Check] = {}


def live(label: str):
    """fn() returns the message (or a list of messages) as PyTorch prints it now."""
    def register(fn):
        CHECKS[label] = Check("live", fn)
        return fn
    return register


def files(label: str):
    """fn(entry) checks the entry's quote against installed files."""
    def register(fn):
        CHECKS[label] = Check("files", fn)
        return fn
    return register


def raised(fn: Callable, *, expected: type = Exception) -> BaseException:
    try:
        fn()
    except expected as exc:  # noqa: PERF203
        return exc
    raise AssertionError("no exception was raised")


def on_gpu_words(text: str) -> str:
    """The meta device stands in for a GPU: the sentence a GPU prints names cuda:0 instead."""
    return text.replace("meta", "cuda:0")


# Tensors and modules on different devices

@files("err-same-device")
def _(entry):
    quote = without_prefix(entry.blocks[0], RuntimeError)
    in_library(LIB / "libtorch_cpu.so", quote, ["cuda:0", "cpu"])
    # PyTorch's tracer (fake tensors, used by torch.compile) mirrors the check word for word.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a, b = torch.empty(3, device="cuda"), torch.empty(3)
        assert str(raised(lambda: a + b)) == quote


@files("err-same-device-argument")
def _(entry):
    quote = without_prefix(entry.blocks[0], RuntimeError)
    in_library(LIB / "libtorch_cpu.so", quote, ["mat1", "cpu", "cuda:0", "wrapper_CUDA_addmm"])


@files("err-index-select")
def _(entry):
    quote = without_prefix(entry.blocks[0], RuntimeError)
    in_library(LIB / "libtorch_cpu.so", quote,
               ["index", "cpu", "cuda:0", "wrapper_CUDA__index_select"])


@files("err-conv-input-type")
def _(entry):
    # A CPU batch meets the mkldnn convolution, which adds its own words; a GPU batch a CPU model.
    first, second = (without_prefix(b, RuntimeError) for b in entry.blocks)
    in_library(LIB / "libtorch_cpu.so", first, ["torch.FloatTensor", "torch.cuda.FloatTensor"])
    assert second.endswith(") should be the same")
    in_library(LIB / "libtorch_cpu.so", second + "\0", ["torch.cuda.FloatTensor", "torch.FloatTensor"])


@live("err-rnn-hidden")
def _():
    rnn = nn.RNN(10, 5).to(META)
    exc = raised(lambda: rnn(torch.randn(4, 3, 10, device=META), torch.zeros(1, 3, 5)))
    return [on_gpu_words(line(exc)), line(exc)]


@live("err-rnn-input")
def _():
    rnn = nn.RNN(10, 5).to(META)
    return on_gpu_words(line(raised(lambda: rnn(torch.randn(4, 3, 10)))))


@files("err-torchmetrics-device")
def _(entry):
    import torchmetrics

    quote = without_prefix(entry.blocks[0], RuntimeError)
    in_source(Path(torchmetrics.__file__).parent / "metric.py", quote,
              ["MulticlassAccuracy", "MulticlassAccuracy"])


@files("err-dataparallel-device")
def _(entry):
    quote = without_prefix(entry.blocks[0], RuntimeError)
    in_source(TORCH / "nn" / "parallel" / "data_parallel.py", quote, ["cuda:0", "cpu"])


@live("err-device-string")
def _():
    return line(raised(lambda: torch.device("gpu")))


@live("err-meta-copy")
def _():
    return line(raised(lambda: nn.Linear(2, 1).to(META).to("cpu")))


# CUDA runtime errors

for _label in CUDA_CODES:
    live(_label)(functools.partial(cuda_raised, _label))


# Install, driver and architecture

@live("err-no-driver")
def _():
    if torch.cuda.is_available() or not torch.version.cuda:
        pytest.skip("needs a CUDA build of PyTorch on a machine without a GPU")
    exc = raised(lambda: torch.zeros(1, device="cuda"))
    if "NVIDIA driver" not in str(exc):
        pytest.skip(f"this machine has a driver but no GPU: {exc}")
    return line(exc)


@files("err-not-compiled")
def _(entry):
    in_source(TORCH / "cuda" / "__init__.py", without_prefix(entry.blocks[0], AssertionError))


@files("err-driver-too-old")
def _(entry):
    quote = without_prefix(entry.blocks[0], RuntimeError)
    in_library(LIB / "libc10_cuda.so", quote, ["12040"])


@live("err-unsupported-gpu")
def _():
    # torch's own check, run as for a Kaggle P100 (compute capability 6.0).
    with pytest.MonkeyPatch.context() as m, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m.setattr(torch.cuda, "is_available", lambda: True)  # get_arch_list() asks
        m.setattr(torch.cuda, "device_count", lambda: 1)
        m.setattr(torch.cuda, "get_device_capability", lambda device=None: (6, 0))
        m.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla P100-PCIE-16GB")
        torch.cuda._check_capability()
    assert caught, "torch.cuda._check_capability() did not warn"
    return normalise(f"UserWarning: {caught[0].message}")


@files("err-cuda-unknown-error")
def _(entry):
    in_library(LIB / "libc10_cuda.so", without_prefix(entry.blocks[0], UserWarning))


@files("err-no-cuda-gpus")
def _(entry):
    in_library(LIB / "libc10_cuda.so", without_prefix(entry.blocks[0], RuntimeError))


# DataLoader workers and multiprocessing

@files("err-forked-cuda")
def _(entry):
    in_source(TORCH / "cuda" / "__init__.py", without_prefix(entry.blocks[0], RuntimeError))


class Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return torch.ones(2) + torch.ones(3)  # a bug in the dataset, raised inside the worker


@live("err-caught-in-worker")
def _():
    loader = torch.utils.data.DataLoader(Squares(), num_workers=1,
                                         multiprocessing_context="fork")
    exc = raised(lambda: next(iter(loader)))
    lines = line(exc).splitlines()
    assert lines[1] == "Original Traceback (most recent call last):"  # as the entry describes
    return lines[0]


MARKER = "TROUBLESHOOTING-RESULTS "
SUBPROCESS = textwrap.dedent("""
    import json, os, signal, sys
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset
    from tests.test_troubleshooting import CUDA_CODES, MARKER, cuda_check_messages

    out = {"cuda": cuda_check_messages(sorted(set(CUDA_CODES.values())))}  # forks: first

    class Squares(Dataset):
        def __len__(self): return 4
        def __getitem__(self, i): return i * i

    class Dies(Dataset):  # a worker killed: by the out-of-memory killer, or a bus error
        def __init__(self, sig): self.sig = sig
        def __len__(self): return 4
        def __getitem__(self, i): os.kill(os.getpid(), self.sig)

    for key, sig in [("killed", signal.SIGKILL), ("bus", signal.SIGBUS)]:
        try:
            list(DataLoader(Dies(sig), num_workers=1, multiprocessing_context="fork"))
        except RuntimeError as exc:
            chain = [exc, exc.__cause__, exc.__context__]
            out[key] = [f"{type(e).__name__}: {e}" for e in chain if e is not None]
    try:
        list(DataLoader(Squares(), num_workers=1, multiprocessing_context="spawn"))
    except RuntimeError as exc:  # the error, and the error it was raised from
        out["loader"] = [f"{type(e).__name__}: {e}" for e in (exc.__cause__, exc)]
    # torch.compile wraps the model; its import is slow, so it runs here, beside the tests.
    compiled = torch.compile(nn.Linear(2, 1))  # compiles lazily: nothing is compiled here
    try:
        nn.Linear(2, 1).load_state_dict(compiled.state_dict())
    except RuntimeError as exc:
        out["compiled"] = str(exc)
    # DistributedDataParallel in a one-process gloo group (what torchrun starts, with one
    # worker); its first construction is slow too.
    import torch.distributed as dist

    class OneUnused(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(2, 1), nn.Linear(2, 1)

        def forward(self, x):
            return self.used(x)

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    model = nn.parallel.DistributedDataParallel(OneUnused())
    model(torch.ones(1, 2)).sum().backward()
    for key, call in [("unused", lambda: model(torch.ones(1, 2))),
                      ("device_ids", lambda: nn.parallel.DistributedDataParallel(
                          nn.Linear(2, 1), device_ids=[0]))]:
        try:
            call()
        except (RuntimeError, ValueError) as exc:
            out[key] = f"{type(exc).__name__}: {exc}"
    dist.destroy_process_group()
    print(MARKER + json.dumps(out))  # gloo prints on stdout too
""")


@pytest.fixture(scope="module", autouse=True)
def _subprocess_in_background():
    """One subprocess, started before the first test and read when needed: a class defined in
    __main__ of an interactive session (python -c, like a notebook) sent to a spawned worker
    (the default on macOS and Windows), a compiled model's state dict, and DDP in a
    one-process gloo group."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen([sys.executable, "-c", SUBPROCESS], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _background.append(proc)
    yield
    if proc.poll() is None:
        proc.kill()
    proc.communicate()
    _background.clear()


_background: list[subprocess.Popen] = []


@functools.lru_cache(maxsize=1)
def background() -> tuple[dict, str]:
    """What the background subprocess printed: its results, and its stderr (pids made fixed)."""
    out, err = _background[0].communicate(timeout=300)
    assert _background[0].returncode == 0, err
    results = [t for t in out.splitlines() if t.startswith(MARKER)]
    assert results, f"the subprocess printed no results:\n{out}\n{err}"
    return json.loads(re.sub(r"\bpid(\(s\))? \d+", r"pid\1 12345", results[-1][len(MARKER):])), err


def error_line(stderr: str, start: str) -> str:
    for text in stderr.splitlines():
        if text.startswith(start):
            return text
    raise AssertionError(f"no line starting with {start!r} in:\n{stderr}")


@live("err-spawn-main")
def _():
    return error_line(background()[1], "AttributeError: ")


@live("err-worker-exited")
def _():
    return background()[0]["loader"]


def killed(key: str) -> str:
    """The worker's own death, which the loader re-raises as 'exited unexpectedly'."""
    chain = background()[0][key]
    found = [text for text in chain if "is killed by signal" in text]
    assert found, f"no 'killed by signal' error in: {chain}"
    return found[0]


@live("err-worker-killed")
def _():
    return [killed("bus"), error_line(background()[1], "ERROR: Unexpected bus error")]


@live("err-worker-killed-oom")
def _():
    return killed("killed")


@files("err-shm-open")
def _(entry):
    quote = without_prefix(entry.blocks[0], RuntimeError)
    in_library(LIB / "libtorch_cpu.so", quote, ["/torch_12345_2779123456_0", "Too many open files", "24"])


# Checkpoints and weights_only

@live("err-deserialize-cuda")
def _():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA, so the checkpoint would load")
    import torch.serialization as serialization

    # The file a GPU writes: its storages are tagged with the device cuda:0.
    buffer = io.BytesIO()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(serialization, "location_tag", lambda storage: "cuda:0")
        torch.save({"w": torch.ones(2)}, buffer)
    buffer.seek(0)
    exc = raised(lambda: torch.load(buffer, weights_only=True))
    buffer.seek(0)
    assert torch.equal(torch.load(buffer, map_location="cpu", weights_only=True)["w"], torch.ones(2))
    return line(exc)


def _load_unsafe(obj) -> BaseException:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return raised(lambda: torch.load(buffer))


@live("err-weights-only")
def _():
    return line(_load_unsafe({"model": {}, "args": argparse.Namespace(lr=0.1)}))


@live("err-weights-only-numpy")
def _():
    exc = _load_unsafe({"model": {}, "best_accuracy": np.float64(0.98)})
    return next(t.strip() for t in str(exc).splitlines() if "WeightsUnpickler error" in t)


@live("err-module-prefix")
def _():
    wrapped = nn.DataParallel(nn.Linear(2, 1))
    return line(raised(lambda: nn.Linear(2, 1).load_state_dict(wrapped.state_dict())))


@live("err-size-mismatch")
def _():
    return line(raised(lambda: nn.Linear(4, 3).load_state_dict(nn.Linear(4, 10).state_dict())))


@live("err-zip-archive")
def _():
    buffer = io.BytesIO()
    torch.save(nn.Linear(2, 2).state_dict(), buffer)
    cut = io.BytesIO(buffer.getvalue()[:200])  # a download or a copy that stopped early
    return line(raised(lambda: torch.load(cut, weights_only=True)))


# Mixed precision and dtypes

@live("err-mat1-mat2-dtype")
def _():
    return line(raised(lambda: nn.Linear(4, 2).half()(torch.ones(3, 4))))


@live("err-conv-bias-type")
def _():
    return line(raised(lambda: nn.Conv2d(1, 1, 3).half()(torch.ones(1, 1, 5, 5))))


@live("err-expected-scalar-type")
def _():
    batch = torch.from_numpy(np.ones((2, 3, 4)))  # NumPy's default float64
    return line(raised(lambda: torch.bmm(batch, torch.ones(2, 4, 5))))


@live("err-rnn-dtype")
def _():
    return line(raised(lambda: nn.LSTM(4, 2)(torch.from_numpy(np.ones((3, 1, 4))))))


@live("err-target-dtype")
def _():
    return line(raised(lambda: F.cross_entropy(torch.ones(3, 4), torch.tensor([0.0, 1.0, 2.0]))))


@live("err-half-overflow")
def _():
    scores = torch.zeros(2, 2, dtype=torch.half)
    mask = torch.tensor([[True, False], [False, True]])
    return line(raised(lambda: scores.masked_fill(mask, -1e9)))


def _scaled_step(param: nn.Parameter, unscale_twice: bool = False) -> None:
    opt = torch.optim.SGD([param], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(param.float().sum()).backward()
    scaler.unscale_(opt)
    if unscale_twice:
        scaler.unscale_(opt)


@live("err-unscale-fp16")
def _():
    return line(raised(lambda: _scaled_step(nn.Parameter(torch.ones(2, dtype=torch.half)))))


@live("err-unscale-twice")
def _():
    return line(raised(lambda: _scaled_step(nn.Parameter(torch.ones(2)), unscale_twice=True)))


# Distributed training

@live("err-default-process-group")
def _():
    import torch.distributed as dist

    assert not dist.is_initialized()
    return line(raised(lambda: dist.get_rank()))


@live("err-env-rank")
def _():
    import torch.distributed as dist

    with pytest.MonkeyPatch.context() as m:
        for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
            m.delenv(name, raising=False)
        return line(raised(lambda: dist.init_process_group("gloo")))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@live("err-address-in-use")
def _():
    from torch.distributed import TCPStore

    port = free_port()
    first = TCPStore("127.0.0.1", port, 1, True)
    try:
        exc = raised(lambda: TCPStore("127.0.0.1", port, 1, True))
    finally:
        del first
    return line(exc).replace(f"port: {port},", "port: 29500,")


@live("err-ddp-unused-parameters")
def _():
    return background()[0]["unused"]


@live("err-ddp-device-ids")
def _():
    return background()[0]["device_ids"]


@files("err-nccl-timeout")
def _(entry):
    in_library(LIB / "libtorch_cuda.so", entry.blocks[0],
               ["1", "ALLREDUCE", "2048", "2048", "600000", "600048"])


@files("err-nccl-error")
def _(entry):
    first, second = entry.blocks[0].splitlines()
    quote = without_prefix(first, torch.distributed.DistBackendError)
    nccl = nvidia_library("libnccl.so*")
    nccl.ncclGetErrorString.restype = ctypes.c_char_p
    words = nccl.ncclGetErrorString(1).decode()  # ncclUnhandledCudaError
    assert f", {words}, NCCL version " in quote, f"NCCL words error 1 as: {words}"
    where = re.search(r"NCCL error in: (\S+), ", quote)[1]
    version = re.search(r"NCCL version (\S+)$", quote)[1]
    assert version == ".".join(map(str, torch.cuda.nccl.version())), "the NCCL installed with torch"
    in_library(LIB / "libtorch_cuda.so", quote, [where, words, version])
    source = where.removeprefix(".../").split(":")[0]  # the file that raised it
    assert f"/{source}".encode() in rodata(LIB / "libtorch_cuda.so")
    in_library(LIB / "libtorch_cuda.so", second)


@files("err-nccl-not-built")
def _(entry):
    in_source(TORCH / "distributed" / "distributed_c10d.py",
              without_prefix(entry.blocks[0], RuntimeError))


# Autograd and tensor shapes

@live("err-no-grad-fn")
def _():
    with torch.no_grad():  # a loss computed where autograd records nothing
        loss = torch.ones(2, requires_grad=True).sum()
    return line(raised(loss.backward))


@live("err-view-stride")
def _():
    return line(raised(lambda: torch.zeros(2, 3).t().view(6)))


@live("err-backward-twice")
def _():
    w = torch.ones(2, requires_grad=True)
    loss = (w * w).sum()
    loss.backward()
    return line(raised(loss.backward))


# torch.compile

@live("err-compile-prefix")
def _():
    return f"RuntimeError: {background()[0]['compiled']}"


@files("err-triton-gpu-too-old")
def _(entry):
    from torch._inductor.exc import GPUTooOldForTriton

    # A ShortenTraceback: torch.compile re-raises it as it is, without wrapping it.
    quote = without_prefix(entry.blocks[0], GPUTooOldForTriton)
    in_source(TORCH / "_inductor" / "exc.py", quote, ["Tesla P100-PCIE-16GB", "6", "0"])


@files("err-no-triton")
def _(entry):
    from torch._inductor.exc import TritonMissing

    in_source(TORCH / "_inductor" / "exc.py", without_prefix(entry.blocks[0], TritonMissing))


# Memory

OOM_HELP = (" If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
            "documentation for Memory Management  ")
OOM_LINKS = ("(https://docs.pytorch.org/docs/stable/notes/cuda.html"
             "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
             "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")  # 2.9
# What varies: sizes (c10's format_size), the GPU's number, process ids (NVML's, see below).
OOM_VARIABLES = re.compile(r"\d+\.\d+ [KMG]iB|(?<=GPU )\d+(?= has)|(?<=Process )\d+")


def oom(entry: Entry) -> None:
    """Each quoted form of the entry against libc10_cuda.so. The allocator lists the processes
    NVML reports on the GPU, in NVML's order: 'Including non-PyTorch memory, this process' for the
    one whose pid is its own, 'Process N' for every other pid. In a container (Colab, Docker)
    NVML reports host pids, so the process names itself 'Process N'; without NVML there is no
    list."""
    assert issubclass(torch.OutOfMemoryError, RuntimeError)
    assert torch.cuda.OutOfMemoryError is torch.OutOfMemoryError
    for block in entry.blocks:
        quote = without_prefix(block, torch.OutOfMemoryError)
        assert quote.endswith(tuple(OOM_HELP + link for link in OOM_LINKS)), quote
        in_library(LIB / "libc10_cuda.so", quote,
                   [m[0] for m in OOM_VARIABLES.finditer(quote)])


THIS_PROCESS = "Including non-PyTorch memory, this process has "


@files("err-cuda-oom")
def _(entry):
    oom(entry)
    if entry.blocks in entry.older.values():  # the oldest torch's wording, one form
        return
    host, container, no_nvml = entry.blocks
    assert THIS_PROCESS in host and "Process " not in host
    assert THIS_PROCESS not in container and "is free. Process " in container
    assert THIS_PROCESS not in no_nvml and "is free. Of the allocated memory" in no_nvml


@files("err-cuda-oom-other-process")
def _(entry):
    oom(entry)
    assert f"Process 4242 has 8.20 GiB memory in use. {THIS_PROCESS}" in entry.blocks[0]


@files("err-cuda-oom-private-pools")
def _(entry):
    oom(entry)
    assert " allocated in private pools (e.g., CUDA Graphs), " in entry.blocks[0]


@files("err-cuda-oom-fraction")
def _(entry):
    oom(entry)
    assert " allowed; Of the allocated memory " in entry.blocks[0]
    # The opt-in preemptive rejection (throw_on_cudamalloc_oom), which the entry names too.
    preemptive = re.search(r"`(CUDA out of memory\. Allocation was preemptively [^`]+ )\.\.\.`",
                           entry.text)
    assert preemptive, "the entry names the preemptive rejection's opening words"
    in_library(LIB / "libc10_cuda.so", preemptive[1])


@files("err-cublas-status")
def _(entry):
    in_library(LIB / "libtorch_cuda.so", without_prefix(entry.blocks[0], RuntimeError))


@files("err-cudnn-status")
def _(entry):
    cudnn = nvidia_library("libcudnn.so*")
    cudnn.cudnnGetErrorString.restype = ctypes.c_char_p
    words = cudnn.cudnnGetErrorString(3000).decode()  # CUDNN_STATUS_NOT_SUPPORTED
    quote = without_prefix(entry.blocks[0], RuntimeError)
    assert quote.startswith(f"cuDNN error: {words}. "), f"cuDNN words status 3000 as: {words}"
    in_library(LIB / "libtorch_cuda.so", quote, [words])


@live("err-cpu-oom")
def _():
    return line(raised(lambda: torch.empty(2**50)))


# Apple MPS (the messages are compiled only into macOS builds; PyTorch's own test suite, which
# every build installs, quotes them, and tests/test_troubleshooting_gpu.py raises them on a Mac)

TESTSUITE = TORCH / "testing" / "_internal"


def in_testsuite(sentence: str) -> None:
    for path in TESTSUITE.rglob("*.py"):
        if sentence in path.read_text(errors="replace"):
            return
    raise AssertionError(f"PyTorch's installed test suite does not quote: {sentence}")


@files("err-mps-float64")
def _(entry):
    quote = without_prefix(entry.blocks[0], TypeError)
    in_testsuite(quote.split(". Please use float32 instead.")[0])


@files("err-mps-not-implemented")
def _(entry):
    quote = without_prefix(entry.blocks[0], NotImplementedError)
    first = quote.split(". ")[0]
    in_testsuite(first)


@files("err-mps-pin-memory")
def _(entry):
    in_source(TORCH / "utils" / "data" / "dataloader.py", without_prefix(entry.blocks[0], UserWarning))


# The book's trainers

@live("err-lightning-no-gpu")
def _():
    import lightning as L

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    return line(raised(lambda: L.Trainer(accelerator="gpu", logger=False)))


@live("err-lightning-gpus")
def _():
    import lightning as L

    return line(raised(lambda: L.Trainer(gpus=1)))


@files("err-lightning-tensor-cores")
def _(entry):
    import lightning

    in_source(Path(lightning.__file__).parent / "fabric" / "accelerators" / "cuda.py",
              entry.blocks[0], ["'NVIDIA H100 80GB HBM3'"])


@live("err-torchkeras-model")
def _():
    import torchkeras

    return line(raised(lambda: torchkeras.Model))


# NumPy interop

@live("err-numpy-cuda")
def _():
    return on_gpu_words(line(raised(lambda: torch.ones(2, device=META).numpy())))


@live("err-numpy-requires-grad")
def _():
    return line(raised(lambda: torch.ones(2, requires_grad=True).numpy()))


@live("err-numpy-object")
def _():
    return line(raised(lambda: torch.tensor(np.array([1.5, "2.5"], dtype=object))))


@live("err-item-several-elements")
def _():
    return [line(raised(lambda: torch.ones(2).item())), line(raised(lambda: float(torch.ones(2))))]


@live("err-numpy-not-writable")
def _():
    array = np.ones(3)
    array.flags.writeable = False  # what np.frombuffer and some image readers hand out
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.from_numpy(array)
    return normalise(f"UserWarning: {caught[0].message}")


# -- the tests --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def page() -> dict[str, Entry]:
    return read_entries()


# The entries that read the background subprocess come last, so that it runs beside the others.
LATE = ("err-spawn-main", "err-worker-exited", "err-worker-killed", "err-worker-killed-oom",
        "err-compile-prefix", "err-ddp-unused-parameters", "err-ddp-device-ids", *CUDA_CODES)


@pytest.mark.parametrize("label", sorted(set(CHECKS) - set(LATE)) + list(LATE))
def test_entry(label: str, page: dict[str, Entry]) -> None:
    assert label in page, f"[{label}] is checked here but the page has no such entry"
    entry = page[label]
    check = CHECKS[label]
    assert entry.kind == check.kind, \
        f"[{label}] the page says '{entry.how}', the test {check.kind} checks it"
    assert entry.version == pinned_torch(), \
        f"[{label}] checked with torch {entry.version}; the book pins torch {pinned_torch()}"
    version = torch.__version__.split("+")[0]
    older = entry.older.get(version, [])
    if check.kind == "files":
        try:  # on a torch whose wording the page gives too (the oldest supported), check that
            check.fn(dataclasses.replace(entry, blocks=older) if older else entry)
        except AssertionError as exc:
            if not on_pinned_torch():
                pytest.skip(f"the page documents torch {pinned_torch()}; [{label}] {exc}")
            raise AssertionError(f"[{label}] {entry.heading}\n{exc}") from None
        return
    failure = live_mismatch(entry, check.fn())
    if failure and on_pinned_torch():
        pytest.fail(failure)
    if failure:
        pytest.skip(f"the page documents torch {pinned_torch()}; {failure}")


def live_mismatch(entry: Entry, printed: str | list[str]) -> str:
    """Empty when the page quotes everything PyTorch printed (for this torch, if the page gives
    its own wording); else what torch prints now beside what the page quotes."""
    version = torch.__version__.split("+")[0]
    quoted = entry.older.get(version) or entry.blocks
    texts = [normalise(t) for t in (printed if isinstance(printed, list) else [printed])]
    if all(text in quoted for text in texts):
        return ""
    return (f"[{entry.label}] {entry.heading}\ntorch {torch.__version__} prints now:\n"
            + "\n--\n".join(texts) + "\nthe page quotes:\n" + "\n--\n".join(quoted))


OLDEST_PYTHON = ROOT / ".venv-oldest" / "bin" / "python"
ORACLE = textwrap.dedent("""
    import json
    from tests import test_troubleshooting as t

    print(t.MARKER + json.dumps(t.older_wordings_report()))
""")


def older_wordings_report() -> dict[str, str]:
    """Run by the oldest supported torch: each entry's check against the wording the page gives
    for that torch ('' when it holds, else why not)."""
    version = torch.__version__.split("+")[0]
    report = {}
    for label, entry in read_entries().items():
        if version not in entry.older:
            continue
        check = CHECKS[label]
        try:
            if check.kind == "files":
                check.fn(dataclasses.replace(entry, blocks=entry.older[version]))
                report[label] = ""
            else:
                report[label] = live_mismatch(entry, check.fn())
        except (AssertionError, pytest.skip.Exception) as exc:
            report[label] = f"[{label}] {type(exc).__name__}: {exc}"
    return report


def test_older_wordings_are_what_the_oldest_torch_prints(page, request) -> None:
    """The wordings the page gives for the oldest supported torch (what Colab and GPU servers
    with an older torch print), checked by that torch (`make oldest` installs it)."""
    versions = {v for entry in page.values() for v in entry.older}
    assert versions <= {oldest_torch()}, f"older wordings for {versions}: only {oldest_torch()} is checked"
    labels = {label for label, entry in page.items() if entry.older}
    assert labels, "the page gives no older wording"
    assert not labels & {"err-spawn-main", "err-worker-exited", "err-compile-prefix",
                         "err-ddp-unused-parameters", "err-ddp-device-ids"}, \
        "these entries are checked in the background subprocess only"
    if not on_pinned_torch():
        pytest.skip(f"torch {torch.__version__} checks its own wordings in test_entry")
    if not OLDEST_PYTHON.exists():
        message = f"{OLDEST_PYTHON.relative_to(ROOT)} is missing: run `make oldest-venv` first"
        if request.config.getoption("--require-book"):
            pytest.fail(message)
        pytest.skip(message)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([str(OLDEST_PYTHON), "-c", ORACLE], cwd=ROOT, env=env, text=True,
                         capture_output=True, timeout=300)
    results = [t for t in run.stdout.splitlines() if t.startswith(MARKER)]
    assert run.returncode == 0 and results, run.stdout + run.stderr
    report = json.loads(results[-1][len(MARKER):])
    assert set(report) == labels
    problems = [why for why in report.values() if why]
    assert not problems, "\n\n".join(problems)


def test_every_entry_is_checked(page: dict[str, Entry]) -> None:
    unchecked = sorted(set(page) - set(CHECKS))
    assert not unchecked, f"entries without a check: {unchecked}"
    assert len(page) >= MIN_ENTRIES, f"the index has {len(page)} entries"


def test_contents_list_links_every_entry_under_its_group(page: dict[str, Entry]) -> None:
    text = PAGE.read_text()
    contents = text[:text.index("\n## ")]
    for entry in page.values():
        assert f"<{entry.label}>`" in contents, f"the contents list does not link {entry.label}"
    groups = re.findall(r"^## (.+)$", text, re.M)
    assert len(groups) >= 10
    for group in groups:
        label = re.search(rf"^\((grp-[a-z-]+)\)=\n## {re.escape(group)}$", text, re.M)
        assert label, f"group {group!r} has no (grp-...)= label"
        assert f"<{label[1]}>`" in contents, f"the contents list does not link {group!r}"


def test_one_short_paragraph_per_entry(page: dict[str, Entry]) -> None:
    for entry in page.values():
        prose = re.sub(r"```text\n.*?```", "", entry.text, flags=re.S)
        prose = "\n".join(t for t in prose.splitlines()
                          if t and not t.startswith(("(err-", "(grp-", "#", "*Checked")))
        assert len(prose.split()) <= 110, f"[{entry.label}] explains in {len(prose.split())} words"
        assert "{doc}`" in prose, f"[{entry.label}] links no chapter"


def test_links_point_to_chapters_that_exist() -> None:
    links = re.findall(r"\{doc\}`[^`<]*<([^>]+)>`", PAGE.read_text())
    assert links
    toc = (ROOT / "_toc.yml").read_text()
    for link in set(links):
        assert f"chapters/{link}" in toc, f"{link} is not in the table of contents"
        assert (ROOT / "chapters" / f"{link}.ipynb").exists()
