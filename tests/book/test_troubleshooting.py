"""The troubleshooting index (chapter 9) quotes PyTorch's messages word for word.

Every entry of the page has a named check in the table ``ENTRIES`` (at the end of the checks),
with how it is raised or why it cannot be, and the page's last line of the entry says which:

- *reproduced live*: the message is raised now, with the installed PyTorch, on the CPU, on the
  ``meta`` device (which names ``meta`` where a GPU names ``cuda:0``), through DataLoader workers,
  with a one-process gloo group, or in a spawned subprocess; the page must quote it exactly;
- *found in installed files*: the message cannot be raised without a GPU (or an Apple GPU), so
  its fixed text, cut at the parts that vary (sizes, device numbers), is looked up in the
  files PyTorch installed: the string constants of its compiled libraries, the string literals
  of its Python sources (where the varying parts must meet the template's placeholders), or
  the CUDA runtime's own error strings, asked from ``libcudart`` live.

``tests/book/test_troubleshooting_gpu.py`` reproduces the CUDA-only and MPS-only messages on such a
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import ROOT
from tests.support import (
    TROUBLESHOOTING,
    Entry,
    line,
    normalise,
    raised,
    read_entries,
    type_name,
)

SITE = Path(torch.__file__).resolve().parents[1]  # site-packages
TORCH = SITE / "torch"
LIB = TORCH / "lib"
META = torch.device("meta")
MIN_ENTRIES = 45


# -- the torch the page documents ---------------------------------------------------------------

def pinned_torch() -> str:
    match = re.search(r"^torch==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M)
    assert match, "requirements.txt pins no torch"
    return match[1]


def on_pinned_torch() -> bool:
    return torch.__version__.split("+")[0] == pinned_torch()


def oldest_torch() -> str:
    """The oldest torch the book supports, which `make oldest` installs in .venv-oldest."""
    from helpers import MIN_TORCH

    return MIN_TORCH


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
              "err-insufficient-driver": 35, "err-invalid-device-ordinal": 101,
              "err-cuda-error-oom": 2}


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
# Each entry of the page has a named check in the table ENTRIES at the end of this file:
# raise_<entry>() raises the message live and returns what PyTorch printed (one text or a list);
# find_<entry>(entry) finds the entry's quote in installed files, where no live reproduction
# exists, for the reason the table gives.


@dataclass(frozen=True)
class Check:
    kind: str  # "live" or "files", as the page's 'Checked with' line says
    fn: Callable
    why: str  # live: how it is raised; files: why it cannot be raised here


def Live(fn: Callable[[], str | list[str]], how: str) -> Check:  # noqa: N802
    return Check("live", fn, how)


def Files(fn: Callable[[Entry], None], why: str) -> Check:  # noqa: N802
    return Check("files", fn, why)


def MacOS(fn: Callable[[Entry], None], why: str) -> Check:  # noqa: N802
    """A message compiled only into macOS builds: found in their files, skipped elsewhere (the
    page says so, rather than that it was checked)."""
    return Check("macos", fn, why)


def on_gpu_words(text: str) -> str:
    """The meta device stands in for a GPU: the sentence a GPU prints names cuda:0 instead."""
    return text.replace("meta", "cuda:0")


# Tensors and modules on different devices

def find_same_device(entry: Entry) -> None:
    quote = without_prefix(entry.blocks[0], RuntimeError)
    in_library(LIB / "libtorch_cpu.so", quote, ["cuda:0", "cpu"])
    # PyTorch's tracer (fake tensors, used by torch.compile) mirrors the check word for word.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a, b = torch.empty(3, device="cuda"), torch.empty(3)
        assert str(raised(lambda: a + b)) == quote


def find_same_device_argument(entry: Entry) -> None:
    quote = without_prefix(entry.blocks[0], RuntimeError)
    in_library(LIB / "libtorch_cpu.so", quote, ["mat1", "cpu", "cuda:0", "wrapper_CUDA_addmm"])


def find_index_select(entry: Entry) -> None:
    quote = without_prefix(entry.blocks[0], RuntimeError)
    in_library(LIB / "libtorch_cpu.so", quote,
               ["index", "cpu", "cuda:0", "wrapper_CUDA__index_select"])


def conv_backend(batch: int, side: int, kernel: int | tuple[int, int]) -> str:
    """The kernel PyTorch picks for a CPU batch of ``batch`` one-channel images (what a GPU
    model's convolution meets when the batch was left on the CPU): its choice is made from the
    input alone, so CPU weights stand in for the GPU's."""
    height, width = (kernel, kernel) if isinstance(kernel, int) else kernel
    x, w = torch.ones(batch, 1, side, side), torch.ones(1, 1, height, width)
    return torch._C._select_conv_backend(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                         None).name


def find_conv_input_type(entry: Entry) -> None:
    # A CPU batch meets the mkldnn convolution, which adds its own words; a GPU batch a CPU model;
    # one small CPU image the plain ("slow") kernel, whose CUDA wrapper checks devices first.
    first, second, small = (without_prefix(b, RuntimeError) for b in entry.blocks)
    in_library(LIB / "libtorch_cpu.so", first, ["torch.FloatTensor", "torch.cuda.FloatTensor"])
    assert second.endswith(") should be the same")
    in_library(LIB / "libtorch_cpu.so", second + "\0", ["torch.cuda.FloatTensor", "torch.FloatTensor"])
    wrapper = "wrapper_CUDA___slow_conv2d_forward"
    in_library(LIB / "libtorch_cpu.so", small, ["weight", "cuda:0", "cpu", wrapper])
    assert small.endswith(f"(when checking argument in method {wrapper})")
    cuda_lib = LIB / "libtorch_cuda.so"
    if cuda_lib.exists():  # the CUDA build: the wrapper's name is compiled in
        assert wrapper.encode() + b"\0" in rodata(cuda_lib)
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this build has no oneDNN: its CPU convolutions choose otherwise")
    # The page's account of the choice: one MNIST digit through a 3x3 kernel takes the plain
    # kernel, up to 20,480 values; a real batch, a larger image or a 5x5 kernel take oneDNN's.
    assert conv_backend(1, 28, 3) == conv_backend(1, 143, 3) == "Slow2d"  # 143^2 = 20,449
    assert conv_backend(1, 144, 3) == "Mkldnn"  # 144^2 = 20,736
    assert conv_backend(8, 28, 3) == conv_backend(1, 28, 5) == "Mkldnn"
    assert conv_backend(1, 28, (5, 3)) == conv_backend(1, 28, (3, 7)) == "Slow2d", "a side of 3"
    threads = torch.get_num_threads()
    try:  # a 1x1 kernel on one thread: the plain kernel below 16 images
        torch.set_num_threads(1)
        assert conv_backend(15, 28, 1) == "Slow2d" and conv_backend(16, 28, 1) == "Mkldnn"
        torch.set_num_threads(2)
        assert conv_backend(15, 28, 1) == "Mkldnn"
    finally:
        torch.set_num_threads(threads)


def raise_rnn_hidden() -> str | list[str]:
    rnn = nn.RNN(10, 5).to(META)
    exc = raised(lambda: rnn(torch.randn(4, 3, 10, device=META), torch.zeros(1, 3, 5)))
    return [on_gpu_words(line(exc)), line(exc)]


def raise_rnn_input() -> str | list[str]:
    rnn = nn.RNN(10, 5).to(META)
    return on_gpu_words(line(raised(lambda: rnn(torch.randn(4, 3, 10)))))


def find_torchmetrics_device(entry: Entry) -> None:
    import torchmetrics

    quote = without_prefix(entry.blocks[0], RuntimeError)
    in_source(Path(torchmetrics.__file__).parent / "metric.py", quote,
              ["MulticlassAccuracy", "MulticlassAccuracy"])


def find_dataparallel_device(entry: Entry) -> None:
    quote = without_prefix(entry.blocks[0], RuntimeError)
    in_source(TORCH / "nn" / "parallel" / "data_parallel.py", quote, ["cuda:0", "cpu"])


def raise_device_string() -> str | list[str]:
    return line(raised(lambda: torch.device("gpu")))


def raise_meta_copy() -> str | list[str]:
    return line(raised(lambda: nn.Linear(2, 1).to(META).to("cpu")))


# Install, driver and architecture

def raise_no_driver() -> str | list[str]:
    if torch.cuda.is_available() or not torch.version.cuda:
        pytest.skip("needs a CUDA build of PyTorch on a machine without a GPU")
    exc = raised(lambda: torch.zeros(1, device="cuda"))
    if "NVIDIA driver" not in str(exc):
        pytest.skip(f"this machine has a driver but no GPU: {exc}")
    return line(exc)


def find_not_compiled(entry: Entry) -> None:
    in_source(TORCH / "cuda" / "__init__.py", without_prefix(entry.blocks[0], AssertionError))


def find_driver_too_old(entry: Entry) -> None:
    quote = without_prefix(entry.blocks[0], RuntimeError)
    in_library(LIB / "libc10_cuda.so", quote, ["12040"])


def warning_on_one_gpu(check: str, name: str, capability: tuple[int, int],
                       cuda_version: str | None = None, **cuda_attrs) -> str:
    """The first warning ``torch.cuda.<check>()`` gives on a faked machine with one GPU,
    ``name`` of compute ``capability``; ``cuda_attrs`` fake more of ``torch.cuda``, and
    ``cuda_version`` the CUDA version the wheel was built with."""
    with pytest.MonkeyPatch.context() as m, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda_version is not None:
            m.setattr(torch.version, "cuda", cuda_version)
        m.setattr(torch.cuda, "device_count", lambda: 1)
        m.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        m.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        for attr, value in cuda_attrs.items():
            m.setattr(torch.cuda, attr, value)
        getattr(torch.cuda, check)()
    assert caught, f"torch.cuda.{check}() did not warn"
    return normalise(f"UserWarning: {caught[0].message}")


def raise_unsupported_gpu() -> str | list[str]:
    # torch's own check, run as for a Kaggle P100 (compute capability 6.0).
    return warning_on_one_gpu("_check_capability", "Tesla P100-PCIE-16GB", (6, 0),
                              is_available=lambda: True)  # get_arch_list() asks


def find_cuda_unknown_error(entry: Entry) -> None:
    in_library(LIB / "libc10_cuda.so", without_prefix(entry.blocks[0], UserWarning))


def find_no_cuda_gpus(entry: Entry) -> None:
    in_library(LIB / "libc10_cuda.so", without_prefix(entry.blocks[0], RuntimeError))


# DataLoader workers and multiprocessing

def find_forked_cuda(entry: Entry) -> None:
    in_source(TORCH / "cuda" / "__init__.py", without_prefix(entry.blocks[0], RuntimeError))


class Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return torch.ones(2) + torch.ones(3)  # a bug in the dataset, raised inside the worker


def raise_caught_in_worker() -> str | list[str]:
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
    from tests.book.test_troubleshooting import CUDA_CODES, MARKER, cuda_check_messages

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
    # Activation checkpointing; its import is slow too.
    import warnings
    from torch.utils.checkpoint import checkpoint

    for key, call in [("use_reentrant", lambda: checkpoint(torch.sin, torch.ones(2, requires_grad=True))),
                      # The reentrant variant differentiates through its inputs only: the
                      # weights inside get no gradient when no input requires one (a batch).
                      ("no_grad_inputs", lambda: checkpoint(nn.Linear(2, 2), torch.ones(1, 2),
                                                            use_reentrant=True))]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        out[key] = f"{caught[0].category.__name__}: {caught[0].message}"
    print(MARKER + json.dumps(out))  # gloo prints on stdout too
    # Everything is printed: skip the interpreter's teardown of torch and its compiler (about
    # a CPU-second, and seconds of wall time the first test reading the results sat through).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
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


def raise_spawn_main() -> str | list[str]:
    return error_line(background()[1], "AttributeError: ")


def raise_worker_exited() -> str | list[str]:
    return background()[0]["loader"]


def killed(key: str) -> str:
    """The worker's own death, which the loader re-raises as 'exited unexpectedly'."""
    chain = background()[0][key]
    found = [text for text in chain if "is killed by signal" in text]
    assert found, f"no 'killed by signal' error in: {chain}"
    return found[0]


def raise_worker_killed() -> str | list[str]:
    return [killed("bus"), error_line(background()[1], "ERROR: Unexpected bus error")]


def raise_worker_killed_oom() -> str | list[str]:
    return killed("killed")


def find_shm_open(entry: Entry) -> None:
    quote = without_prefix(entry.blocks[0], RuntimeError)
    in_library(LIB / "libtorch_cpu.so", quote, ["/torch_12345_2779123456_0", "Too many open files", "24"])


# Checkpoints and weights_only

def raise_deserialize_cuda() -> str | list[str]:
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


def raise_weights_only() -> str | list[str]:
    return line(_load_unsafe({"model": {}, "args": argparse.Namespace(lr=0.1)}))


def raise_weights_only_numpy() -> str | list[str]:
    exc = _load_unsafe({"model": {}, "best_accuracy": np.float64(0.98)})
    return next(t.strip() for t in str(exc).splitlines() if "WeightsUnpickler error" in t)


def raise_module_prefix() -> str | list[str]:
    wrapped = nn.DataParallel(nn.Linear(2, 1))
    return line(raised(lambda: nn.Linear(2, 1).load_state_dict(wrapped.state_dict())))


def raise_size_mismatch() -> str | list[str]:
    return line(raised(lambda: nn.Linear(4, 3).load_state_dict(nn.Linear(4, 10).state_dict())))


def raise_zip_archive() -> str | list[str]:
    buffer = io.BytesIO()
    torch.save(nn.Linear(2, 2).state_dict(), buffer)
    cut = io.BytesIO(buffer.getvalue()[:200])  # a download or a copy that stopped early
    return line(raised(lambda: torch.load(cut, weights_only=True)))


# Mixed precision and dtypes

def raise_mat1_mat2_dtype() -> str | list[str]:
    return line(raised(lambda: nn.Linear(4, 2).half()(torch.ones(3, 4))))


def raise_conv_bias_type() -> str | list[str]:
    return line(raised(lambda: nn.Conv2d(1, 1, 3).half()(torch.ones(1, 1, 5, 5))))


def raise_expected_scalar_type() -> str | list[str]:
    batch = torch.from_numpy(np.ones((2, 3, 4)))  # NumPy's default float64
    return line(raised(lambda: torch.bmm(batch, torch.ones(2, 4, 5))))


def raise_rnn_dtype() -> str | list[str]:
    return line(raised(lambda: nn.LSTM(4, 2)(torch.from_numpy(np.ones((3, 1, 4))))))


def raise_target_dtype() -> str | list[str]:
    return line(raised(lambda: F.cross_entropy(torch.ones(3, 4), torch.tensor([0.0, 1.0, 2.0]))))


def raise_half_overflow() -> str | list[str]:
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


def raise_unscale_fp16() -> str | list[str]:
    return line(raised(lambda: _scaled_step(nn.Parameter(torch.ones(2, dtype=torch.half)))))


def raise_unscale_twice() -> str | list[str]:
    return line(raised(lambda: _scaled_step(nn.Parameter(torch.ones(2)), unscale_twice=True)))


# Distributed training

def raise_default_process_group() -> str | list[str]:
    import torch.distributed as dist

    assert not dist.is_initialized()
    return line(raised(lambda: dist.get_rank()))


def raise_env_rank() -> str | list[str]:
    import torch.distributed as dist

    with pytest.MonkeyPatch.context() as m:
        for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
            m.delenv(name, raising=False)
        return line(raised(lambda: dist.init_process_group("gloo")))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raise_address_in_use() -> str | list[str]:
    from torch.distributed import TCPStore

    port = free_port()
    first = TCPStore("127.0.0.1", port, 1, True)
    try:
        exc = raised(lambda: TCPStore("127.0.0.1", port, 1, True))
    finally:
        del first
    return line(exc).replace(f"port: {port},", "port: 29500,")


def raise_ddp_unused_parameters() -> str | list[str]:
    return background()[0]["unused"]


def raise_ddp_device_ids() -> str | list[str]:
    return background()[0]["device_ids"]


def find_nccl_timeout(entry: Entry) -> None:
    in_library(LIB / "libtorch_cuda.so", entry.blocks[0],
               ["1", "ALLREDUCE", "2048", "2048", "600000", "600048"])


def find_nccl_error(entry: Entry) -> None:
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


def find_nccl_not_built(entry: Entry) -> None:
    in_source(TORCH / "distributed" / "distributed_c10d.py",
              without_prefix(entry.blocks[0], RuntimeError))


# Autograd and tensor shapes

def raise_no_grad_fn() -> str | list[str]:
    with torch.no_grad():  # a loss computed where autograd records nothing
        loss = torch.ones(2, requires_grad=True).sum()
    return line(raised(loss.backward))


def raise_view_stride() -> str | list[str]:
    return line(raised(lambda: torch.zeros(2, 3).t().view(6)))


def raise_backward_twice() -> str | list[str]:
    w = torch.ones(2, requires_grad=True)
    loss = (w * w).sum()
    loss.backward()
    return line(raised(loss.backward))


def raise_checkpoint_use_reentrant() -> str:
    return background()[0]["use_reentrant"]


def raise_checkpoint_no_grad_inputs() -> str:
    return background()[0]["no_grad_inputs"]


# torch.compile

def raise_compile_prefix() -> str | list[str]:
    return f"RuntimeError: {background()[0]['compiled']}"


def find_triton_gpu_too_old(entry: Entry) -> None:
    from torch._inductor.exc import GPUTooOldForTriton

    # A ShortenTraceback: torch.compile re-raises it as it is, without wrapping it.
    quote = without_prefix(entry.blocks[0], GPUTooOldForTriton)
    in_source(TORCH / "_inductor" / "exc.py", quote, ["Tesla P100-PCIE-16GB", "6", "0"])


def find_no_triton(entry: Entry) -> None:
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


def find_cuda_oom(entry: Entry) -> None:
    oom(entry)
    if entry.blocks in entry.older.values():  # the oldest torch's wording, one form
        return
    host, container, no_nvml = entry.blocks
    assert THIS_PROCESS in host and "Process " not in host
    assert THIS_PROCESS not in container and "is free. Process " in container
    assert THIS_PROCESS not in no_nvml and "is free. Of the allocated memory" in no_nvml


def find_cuda_oom_other_process(entry: Entry) -> None:
    oom(entry)
    assert f"Process 4242 has 8.20 GiB memory in use. {THIS_PROCESS}" in entry.blocks[0]


def find_cuda_oom_private_pools(entry: Entry) -> None:
    oom(entry)
    assert " allocated in private pools (e.g., CUDA Graphs), " in entry.blocks[0]


def find_cuda_oom_fraction(entry: Entry) -> None:
    oom(entry)
    assert " allowed; Of the allocated memory " in entry.blocks[0]
    # The opt-in preemptive rejection (throw_on_cudamalloc_oom), which the entry names too.
    preemptive = re.search(r"`(CUDA out of memory\. Allocation was preemptively [^`]+ )\.\.\.`",
                           entry.text)
    assert preemptive, "the entry names the preemptive rejection's opening words"
    in_library(LIB / "libc10_cuda.so", preemptive[1])


def find_cublas_status(entry: Entry) -> None:
    in_library(LIB / "libtorch_cuda.so", without_prefix(entry.blocks[0], RuntimeError))


def find_cudnn_status(entry: Entry) -> None:
    cudnn = nvidia_library("libcudnn.so*")
    cudnn.cudnnGetErrorString.restype = ctypes.c_char_p
    words = cudnn.cudnnGetErrorString(3000).decode()  # CUDNN_STATUS_NOT_SUPPORTED
    quote = without_prefix(entry.blocks[0], RuntimeError)
    assert quote.startswith(f"cuDNN error: {words}. "), f"cuDNN words status 3000 as: {words}"
    in_library(LIB / "libtorch_cuda.so", quote, [words])


def raise_cpu_oom() -> str | list[str]:
    return line(raised(lambda: torch.empty(2**50)))


# Apple MPS (the messages are compiled only into macOS builds; PyTorch's own test suite, which
# every build installs, quotes them, and tests/book/test_troubleshooting_gpu.py raises them on a Mac)

TESTSUITE = TORCH / "testing" / "_internal"


def in_testsuite(sentence: str) -> None:
    for path in TESTSUITE.rglob("*.py"):
        if sentence in path.read_text(errors="replace"):
            return
    raise AssertionError(f"PyTorch's installed test suite does not quote: {sentence}")


def in_macos_build(quote: str, variables: list[str] = ()) -> None:
    """The quote in libtorch_cpu.dylib, where torch is a macOS build (the only builds with
    MPS kernels); elsewhere the message is in no installed file, and the GPU test checks it."""
    dylib = LIB / "libtorch_cpu.dylib"
    if not dylib.exists():
        pytest.skip("compiled only into macOS builds of torch; tests/book/test_troubleshooting_gpu.py "
                    "raises it on an Apple GPU")
    data = dylib.read_bytes()
    for piece in pieces(quote, list(variables)):
        assert piece is None or piece.encode() in data, f"{piece!r} is not in {dylib.name}"


def find_mps_linear_device(entry: Entry) -> None:
    # TORCH_CHECK(weight_arg.is_mps(), "Tensor for argument weight is on ", device, " but expected on mps")
    in_macos_build(without_prefix(entry.blocks[0], RuntimeError), ["cpu"])


def find_mps_placeholder(entry: Entry) -> None:
    in_macos_build(without_prefix(entry.blocks[0], RuntimeError))


def find_mps_float64(entry: Entry) -> None:
    quote = without_prefix(entry.blocks[0], TypeError)
    in_testsuite(quote.split(". Please use float32 instead.")[0])


def find_mps_not_implemented(entry: Entry) -> None:
    quote = without_prefix(entry.blocks[0], NotImplementedError)
    first = quote.split(". ")[0]
    in_testsuite(first)


def find_mps_pin_memory(entry: Entry) -> None:
    in_source(TORCH / "utils" / "data" / "dataloader.py", without_prefix(entry.blocks[0], UserWarning))


# The book's trainers

def raise_lightning_no_gpu() -> str | list[str]:
    import lightning as L

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    return line(raised(lambda: L.Trainer(accelerator="gpu", logger=False)))


def raise_lightning_gpus() -> str | list[str]:
    import lightning as L

    return line(raised(lambda: L.Trainer(gpus=1)))


def find_lightning_tensor_cores(entry: Entry) -> None:
    import lightning

    in_source(Path(lightning.__file__).parent / "fabric" / "accelerators" / "cuda.py",
              entry.blocks[0], ["'NVIDIA H100 80GB HBM3'"])


def raise_torchkeras_model() -> str | list[str]:
    import torchkeras

    return line(raised(lambda: torchkeras.Model))


# NumPy interop

def raise_numpy_cuda() -> str | list[str]:
    return on_gpu_words(line(raised(lambda: torch.ones(2, device=META).numpy())))


def raise_numpy_requires_grad() -> str | list[str]:
    return line(raised(lambda: torch.ones(2, requires_grad=True).numpy()))


def raise_numpy_object() -> str | list[str]:
    return line(raised(lambda: torch.tensor(np.array([1.5, "2.5"], dtype=object))))


def raise_item_several_elements() -> str | list[str]:
    return [line(raised(lambda: torch.ones(2).item())), line(raised(lambda: float(torch.ones(2))))]


def raise_numpy_not_writable() -> str | list[str]:
    array = np.ones(3)
    array.flags.writeable = False  # what np.frombuffer and some image readers hand out
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.from_numpy(array)
    return normalise(f"UserWarning: {caught[0].message}")


# -- entries added by the method of issue 29 (most reported first within each group) ---------

def _warned(fn: Callable[[], object]) -> str | list[str]:
    """The warnings fn() gives, each as a traceback prints it: ``Category: message``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    assert caught, "no warning was given"
    return [normalise(f"{w.category.__name__}: {w.message}") for w in caught]


def raise_mat_shapes() -> str | list[str]:
    return line(raised(lambda: nn.Linear(1024, 10)(torch.ones(64, 784))))


def raise_size_mismatch_broadcast() -> str | list[str]:
    return line(raised(lambda: torch.ones(64, 64) + torch.ones(64, 10)))


def raise_inplace_modified() -> str | list[str]:
    def step() -> None:
        a = torch.ones(2, requires_grad=True)
        b = a.exp()
        b.add_(1)  # exp saved its output for backward; this overwrites it
        b.sum().backward()
    return line(raised(step))


def raise_conv_channels() -> str | list[str]:
    return line(raised(lambda: nn.Conv2d(3, 32, 3)(torch.ones(64, 1, 28, 28))))


def raise_target_out_of_bounds() -> str | list[str]:
    return line(raised(lambda: F.cross_entropy(torch.ones(2, 10), torch.tensor([10, 1]))))


def raise_index_out_of_range() -> str | list[str]:
    return line(raised(lambda: nn.Embedding(10, 3)(torch.tensor([10]))))


def raise_conv_input_dims() -> str | list[str]:
    return line(raised(lambda: nn.Conv2d(1, 32, 3)(torch.ones(64, 784))))


def raise_multi_target() -> str | list[str]:
    return line(raised(lambda: F.cross_entropy(torch.ones(2, 10), torch.zeros(2, 1).long())))


def raise_target_size_broadcast() -> str | list[str]:
    return _warned(lambda: F.mse_loss(torch.ones(64, 1), torch.ones(64)))


def raise_leaf_inplace() -> str | list[str]:
    return line(raised(lambda: torch.ones(2, requires_grad=True).sub_(1)))


def raise_grad_scalar() -> str | list[str]:
    return line(raised(lambda: (torch.ones(2, requires_grad=True) * 2).backward()))


def raise_anomaly_nan() -> str | list[str]:
    def step() -> None:
        with torch.autograd.detect_anomaly():
            x = torch.zeros(1, requires_grad=True)
            (x / x).sum().backward()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exc = raised(step)
    first = f"{caught[0].category.__name__}: {caught[0].message}"
    assert "Error detected in DivBackward0" in str(caught[1].message)  # the forward call
    return [line(exc), normalise(first)]


def raise_inference_tensor() -> str | list[str]:
    with torch.inference_mode():
        x = torch.ones(1, 2)
    return line(raised(lambda: nn.Linear(2, 2)(x)))


def raise_nonleaf_grad() -> str | list[str]:
    return _warned(lambda: (torch.ones(2, requires_grad=True) * 2).grad)


def raise_empty_parameters() -> str | list[str]:
    return line(raised(lambda: torch.optim.SGD([], lr=0.1)))


def raise_gradscaler_deprecated() -> str | list[str]:
    if torch.cuda.is_available():
        pytest.skip("the check expects no GPU (a second warning says so)")
    first, no_cuda = _warned(lambda: torch.cuda.amp.GradScaler())
    assert no_cuda.endswith("CUDA is not available.  Disabling.")
    return first


def raise_autocast_deprecated() -> str | list[str]:
    if torch.cuda.is_available():
        pytest.skip("the check expects no GPU (a second warning says so)")
    return _warned(lambda: torch.cuda.amp.autocast())[0]


def raise_lr_scheduler_order() -> str | list[str]:
    opt = torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, 1)
    return _warned(scheduler.step)


def raise_gradscaler_no_cuda() -> str | list[str]:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    return _warned(lambda: torch.amp.GradScaler("cuda"))


def raise_autocast_no_cuda() -> str | list[str]:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    return _warned(lambda: torch.autocast("cuda"))


def find_bf16_unsupported(entry: Entry) -> None:
    in_source(TORCH / "amp" / "autocast_mode.py", without_prefix(entry.blocks[0], RuntimeError))


def raise_embedding_dtype() -> str | list[str]:
    return line(raised(lambda: nn.Embedding(10, 3)(torch.ones(2))))


def raise_int_requires_grad() -> str | list[str]:
    return line(raised(lambda: torch.tensor([1, 2], requires_grad=True)))


def raise_stack_sizes() -> str | list[str]:
    from torch.utils.data import default_collate

    return line(raised(lambda: default_collate([torch.ones(3, 224, 224), torch.ones(1, 224, 224)])))


def find_generator_device(entry: Entry) -> None:
    in_library(LIB / "libtorch_cpu.so", without_prefix(entry.blocks[0], RuntimeError),
               ["cuda", "cpu"])


def raise_too_many_workers() -> str | list[str]:
    # The suggested maximum is the CPUs this process may use; the quote is for 2 (Colab).
    from torch.utils.data import DataLoader

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    loader = DataLoader(range(2), num_workers=cpus + 2)
    warned = _warned(loader.check_worker_number_rationality)
    return [re.sub(r"create \d+ worker processes in total. Our suggested max number of worker "
                   r"in current system is \d+,", "create 4 worker processes in total. Our suggested "
                   "max number of worker in current system is 2,", text) for text in warned]


def raise_collate_pil() -> str | list[str]:
    from PIL import Image
    from torch.utils.data import default_collate

    return line(raised(lambda: default_collate([Image.new("RGB", (2, 2))] * 2)))


def raise_pickle_local() -> str | list[str]:
    from multiprocessing.reduction import ForkingPickler

    def main() -> None:  # a training script's main(), with a lambda handed to the DataLoader
        transform = lambda x: x  # noqa: E731
        ForkingPickler.dumps(transform)
    return line(raised(main)).replace("raise_pickle_local.<locals>.", "")


def find_pin_not_dense(entry: Entry) -> None:
    quote = without_prefix(entry.blocks[0], RuntimeError)
    in_library(LIB / "libtorch_cpu.so", quote, ["torch.cuda.FloatTensor"])
    meta = str(raised(lambda: torch.ones(2, device=META).pin_memory()))
    assert re.fullmatch(r"cannot pin '\w+' only dense CPU tensors can be pinned", meta), meta


def find_pin_memory_thread(entry: Entry) -> None:
    quote = without_prefix(entry.blocks[0], RuntimeError)
    utils = TORCH / "utils" / "data" / "_utils"
    in_source(utils / "pin_memory.py", quote.split("Caught RuntimeError ")[1].rstrip("."), ["0"])
    # ExceptionWrapper.reraise (torch/_utils.py) builds the line: "Caught {type} {where}."
    in_source(TORCH / "_utils.py", quote + "\nOriginal ",
              ["RuntimeError", "in pin memory thread for device 0"])


# -- entries added by the method of issue 29 (second batch) ----------------------------------

def find_equal_devices(entry: Entry) -> None:
    quote = without_prefix(entry.blocks[0], RuntimeError)
    in_library(LIB / "libtorch_cpu.so", quote, ["other", "cuda:0", "cpu", "wrapper_CUDA__equal"])


def find_cublas_alloc(entry: Entry) -> None:
    quote = without_prefix(entry.blocks[0], RuntimeError)
    in_library(LIB / "libtorch_cuda.so", quote)


def find_sync_debug(entry: Entry) -> None:
    in_library(LIB / "libc10_cuda.so", without_prefix(entry.blocks[0], RuntimeError))
    # The switch the entry names exists and takes "error".
    assert "error" in torch.cuda.set_sync_debug_mode.__doc__


def find_cublas_no_context(entry: Entry) -> None:
    in_library(LIB / "libtorch_cuda.so", without_prefix(entry.blocks[0], UserWarning))


def raise_sm_incompatible() -> str | list[str]:
    # torch's check of the wheel's kernels (_check_cubins), run as for an RTX 5090 (sm_120)
    # with a wheel built for GPUs up to sm_90.
    arches = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
    return warning_on_one_gpu("_check_cubins", "NVIDIA GeForce RTX 5090", (12, 0),
                              cuda_version="12.6", get_arch_list=lambda: arches)


def find_device_count_804(entry: Entry) -> None:
    quote = without_prefix(entry.blocks[0], UserWarning)
    cudart = nvidia_library("libcudart.so*")
    cudart.cudaGetErrorString.restype = ctypes.c_char_p
    words = cudart.cudaGetErrorString(804).decode()
    assert quote.endswith(f"Error 804: {words}"), f"the CUDA runtime words error 804 as: {words}"
    in_library(LIB / "libc10_cuda.so", quote, ["804", words])


def raise_xpu_not_compiled() -> str | list[str]:
    if torch.xpu._is_compiled():
        pytest.skip("this PyTorch is built with XPU")
    return line(raised(torch.xpu._lazy_init, expected=AssertionError))


def raise_client_socket_timeout() -> str | list[str]:
    from datetime import timedelta

    from torch.distributed import TCPStore

    port = free_port()  # nothing listens there: rank 0 never started
    exc = raised(lambda: TCPStore("127.0.0.1", port, is_master=False,
                                  timeout=timedelta(seconds=2)))
    # The default timeout is 30 minutes, which the test does not wait for; port as torchrun's.
    return (line(exc).replace(f", {port})", ", 29500)")
            .replace("after 2000ms", "after 1800000ms"))


def raise_ddp_no_grad() -> str | list[str]:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        frozen = nn.Linear(2, 2).requires_grad_(False)
        return line(raised(lambda: nn.parallel.DistributedDataParallel(frozen)))
    finally:
        dist.destroy_process_group()


def find_destroy_process_group(entry: Entry) -> None:
    in_library(LIB / "libtorch_cuda.so", entry.blocks[0])


def raise_child_failed() -> str | list[str]:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failure = ProcessFailure(local_rank=0, pid=12345, exitcode=1, error_file="/nonexistent.json")
    # The report names the host by socket.getfqdn(), a DNS lookup that waits out the
    # resolver's timeout (5 s) where the host's name does not resolve (CI containers); the
    # name is replaced below anyway.
    with pytest.MonkeyPatch.context() as m:
        m.setattr(socket, "getfqdn", lambda name="": "gpu-server")
        text = line(ChildFailedError("train.py", {0: failure}))
    text = re.sub(r"(?m)^(  time      : ).*$", r"\g<1>2026-11-28_10:00:00", text)
    return re.sub(r"(?m)^(  host      : ).*$", r"\g<1>gpu-server", text)


def find_no_cxx_compiler(entry: Entry) -> None:
    quote = entry.blocks[0]
    prefix = "torch._inductor.exc.InductorError: InvalidCxxCompiler: "
    assert quote.startswith(prefix)
    from torch._inductor import exc

    # The error as torch.compile reports it, built from the default configuration (raising it
    # needs a machine without a compiler, and this one builds the book's C++ kernels).
    built = exc.InductorError(exc.InvalidCxxCompiler(), None)
    assert f"{type_name(type(built))}: {built}" == quote
    in_source(TORCH / "_inductor" / "exc.py", quote[len(prefix):],
              ["torch._inductor.config", "(None, 'g++')"])


def raise_recompile_limit() -> str | list[str]:
    import logging

    torch._dynamo.reset()
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("torch._dynamo.convert_frame")
    logger.addHandler(handler)

    def scale(x: torch.Tensor, n: int) -> torch.Tensor:
        return x * n

    compiled = torch.compile(scale, backend="eager", dynamic=False)
    try:
        for n in range(10):  # each number compiles anew; the ninth is one too many
            compiled(torch.ones(2), n)
    finally:
        logger.removeHandler(handler)
        torch._dynamo.reset()
    hits = [r.getMessage() for r in records if "recompile_limit" in r.getMessage()]
    assert hits, "dynamo did not warn"
    return hits[0].splitlines()[0]


def find_triton_out_of_resource(entry: Entry) -> None:
    quote = entry.blocks[0]
    prefix = "triton.runtime.errors.OutOfResources: "
    assert quote.startswith(prefix)
    path = SITE / "triton" / "runtime" / "errors.py"
    if not path.exists():
        pytest.skip("triton is not installed")
    in_source(path, quote[len(prefix):], ["shared memory", "98304", "65536"])


def find_bf16_compile(entry: Entry) -> None:
    in_source(TORCH / "_inductor" / "compile_fx.py", without_prefix(entry.blocks[0], UserWarning),
              ["Tesla T4"])


def raise_lightning_16_mixed_cpu() -> str | list[str]:
    import lightning as L

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        L.Trainer(accelerator="cpu", precision="16-mixed", logger=False,
                  enable_progress_bar=False, enable_model_summary=False,
                  enable_checkpointing=False)
    return [normalise(f"{type(w.message).__name__}: {w.message}") for w in caught
            if "16-mixed" in str(w.message)]


def find_lightning_num_workers(entry: Entry) -> None:
    quote = entry.blocks[0].removeprefix("PossibleUserWarning: ")
    path = SITE / "lightning" / "pytorch" / "trainer" / "connectors" / "data_connector.py"
    in_source(path, quote, ["train_dataloader", "7"])


def find_lightning_gpu_unused(entry: Entry) -> None:
    quote = entry.blocks[0].removeprefix("PossibleUserWarning: ")
    in_source(SITE / "lightning" / "pytorch" / "trainer" / "setup.py", quote)


def find_accelerate_defaults(entry: Entry) -> None:
    first, *values, last = entry.blocks[0].split("\n")
    path = SITE / "accelerate" / "commands" / "launch.py"
    in_source(path, first + "\n")
    in_source(path, last.removeprefix("\n"))
    for value in values:  # "\t`--num_processes` was set to a value of `1`"
        setting = re.fullmatch(r"\t`--\w+` was set to a value of `(.+)`", value)[1]
        in_source(path, value, [setting] if "num_processes" in value else [])


def find_accelerate_kernel(entry: Entry) -> None:
    in_source(SITE / "accelerate" / "utils" / "other.py", entry.blocks[0], ["4.15.0", "5.5.0"])


# -- the table: every entry of the page, its named check, and how or why ----------------------

GPU_KERNEL = "raised only by a CUDA kernel or a CUDA tensor, which a machine without a GPU lacks"
NEEDS_CUDA = "raised only where CUDA runs (or its driver is present), which a CPU machine lacks"
MACOS = ("compiled only into macOS builds: found in libtorch_cpu.dylib there, skipped elsewhere; "
         "the GPU test raises it on an Apple GPU")
CUDA_CHECK = "PyTorch's CUDA error check, handed the runtime's error code {}, in a subprocess"

ENTRIES: dict[str, Check] = {
    # Tensors and modules on different devices
    "err-same-device": Files(find_same_device, GPU_KERNEL + " (the meta device words it "
                             "otherwise; torch.compile's tracer raises it live)"),
    "err-same-device-argument": Files(find_same_device_argument, GPU_KERNEL),
    "err-index-select": Files(find_index_select, GPU_KERNEL),
    "err-conv-input-type": Files(find_conv_input_type, GPU_KERNEL),
    "err-rnn-hidden": Live(raise_rnn_hidden, "meta device as the GPU"),
    "err-rnn-input": Live(raise_rnn_input, "meta device as the GPU"),
    "err-torchmetrics-device": Files(find_torchmetrics_device, "torchmetrics raises it only for "
                                     "a device error of a GPU kernel"),
    "err-dataparallel-device": Files(find_dataparallel_device, "DataParallel checks devices "
                                     "only where CUDA is available"),
    "err-device-string": Live(raise_device_string, "CPU"),
    "err-meta-copy": Live(raise_meta_copy, "meta device"),
    # CUDA runtime errors
    **{label: Live(functools.partial(cuda_raised, label), CUDA_CHECK.format(code))
       for label, code in CUDA_CODES.items()},
    "err-cublas-status": Files(find_cublas_status, GPU_KERNEL + " (cuBLAS)"),
    "err-cudnn-status": Files(find_cudnn_status, GPU_KERNEL + " (cuDNN)"),
    # Install, driver and architecture
    "err-no-driver": Live(raise_no_driver, "a CUDA build on a machine without a GPU"),
    "err-not-compiled": Files(find_not_compiled, "the book's torch is a CUDA build"),
    "err-driver-too-old": Files(find_driver_too_old, NEEDS_CUDA + " (an old driver)"),
    "err-unsupported-gpu": Live(raise_unsupported_gpu, "torch's own check, told it runs on a P100"),
    "err-cuda-unknown-error": Files(find_cuda_unknown_error, NEEDS_CUDA + " (a driver failing)"),
    "err-no-cuda-gpus": Files(find_no_cuda_gpus, NEEDS_CUDA + " (a driver, no visible GPU)"),
    # DataLoader workers and multiprocessing
    "err-forked-cuda": Files(find_forked_cuda, NEEDS_CUDA + " (CUDA started, then a fork)"),
    "err-caught-in-worker": Live(raise_caught_in_worker, "a DataLoader worker"),
    "err-spawn-main": Live(raise_spawn_main, "a spawned worker, in a subprocess"),
    "err-worker-exited": Live(raise_worker_exited, "a spawned worker, in a subprocess"),
    "err-worker-killed": Live(raise_worker_killed, "a worker sent SIGBUS, in a subprocess"),
    "err-worker-killed-oom": Live(raise_worker_killed_oom, "a worker sent SIGKILL, in a subprocess"),
    "err-shm-open": Files(find_shm_open, "needs the process's open-file limit exhausted, which "
                          "would break the test run itself"),
    # Checkpoints and weights_only
    "err-deserialize-cuda": Live(raise_deserialize_cuda, "a checkpoint tagged cuda:0, on the CPU"),
    "err-weights-only": Live(raise_weights_only, "CPU"),
    "err-weights-only-numpy": Live(raise_weights_only_numpy, "CPU"),
    "err-module-prefix": Live(raise_module_prefix, "CPU"),
    "err-size-mismatch": Live(raise_size_mismatch, "CPU"),
    "err-zip-archive": Live(raise_zip_archive, "a truncated checkpoint"),
    # Mixed precision and dtypes
    "err-mat1-mat2-dtype": Live(raise_mat1_mat2_dtype, "CPU"),
    "err-conv-bias-type": Live(raise_conv_bias_type, "CPU"),
    "err-expected-scalar-type": Live(raise_expected_scalar_type, "CPU"),
    "err-rnn-dtype": Live(raise_rnn_dtype, "CPU"),
    "err-target-dtype": Live(raise_target_dtype, "CPU"),
    "err-half-overflow": Live(raise_half_overflow, "CPU"),
    "err-unscale-fp16": Live(raise_unscale_fp16, "CPU, GradScaler"),
    "err-unscale-twice": Live(raise_unscale_twice, "CPU, GradScaler"),
    # Distributed training
    "err-default-process-group": Live(raise_default_process_group, "CPU"),
    "err-env-rank": Live(raise_env_rank, "CPU, gloo"),
    "err-address-in-use": Live(raise_address_in_use, "two stores on one port"),
    "err-ddp-unused-parameters": Live(raise_ddp_unused_parameters, "one-process gloo group"),
    "err-ddp-device-ids": Live(raise_ddp_device_ids, "one-process gloo group"),
    "err-nccl-timeout": Files(find_nccl_timeout, "NCCL runs only on CUDA GPUs"),
    "err-nccl-error": Files(find_nccl_error, "NCCL runs only on CUDA GPUs"),
    "err-nccl-not-built": Files(find_nccl_not_built, "the book's torch is built with NCCL"),
    # Autograd and tensor shapes
    "err-no-grad-fn": Live(raise_no_grad_fn, "CPU"),
    "err-view-stride": Live(raise_view_stride, "CPU"),
    "err-backward-twice": Live(raise_backward_twice, "CPU"),
    "err-checkpoint-use-reentrant": Live(raise_checkpoint_use_reentrant, "CPU, in a subprocess"),
    "err-checkpoint-no-grad-inputs": Live(raise_checkpoint_no_grad_inputs, "CPU, in a subprocess"),
    # torch.compile
    "err-compile-prefix": Live(raise_compile_prefix, "CPU, in a subprocess"),
    "err-triton-gpu-too-old": Files(find_triton_gpu_too_old, "needs a GPU older than Volta"),
    "err-no-triton": Files(find_no_triton, "needs a CUDA GPU and a torch without Triton"),
    # Memory
    "err-cuda-oom": Files(find_cuda_oom, "the CUDA caching allocator runs only on a GPU"),
    "err-cuda-oom-other-process": Files(find_cuda_oom_other_process,
                                        "the CUDA caching allocator runs only on a GPU"),
    "err-cuda-oom-private-pools": Files(find_cuda_oom_private_pools,
                                        "the CUDA caching allocator runs only on a GPU"),
    "err-cuda-oom-fraction": Files(find_cuda_oom_fraction,
                                   "the CUDA caching allocator runs only on a GPU"),
    "err-cpu-oom": Live(raise_cpu_oom, "CPU"),
    # Apple MPS
    "err-mps-linear-device": MacOS(find_mps_linear_device, MACOS),
    "err-mps-placeholder": MacOS(find_mps_placeholder, MACOS),
    "err-mps-float64": Files(find_mps_float64, "compiled only into macOS builds; PyTorch's "
                             "installed test suite quotes its first sentence"),
    "err-mps-not-implemented": Files(find_mps_not_implemented, "compiled only into macOS builds; "
                                     "PyTorch's installed test suite quotes its first sentence"),
    "err-mps-pin-memory": Files(find_mps_pin_memory, "the DataLoader warns only on a Mac"),
    # The book's trainers
    "err-lightning-no-gpu": Live(raise_lightning_no_gpu, "CPU, Lightning"),
    "err-lightning-gpus": Live(raise_lightning_gpus, "CPU, Lightning"),
    "err-lightning-tensor-cores": Files(find_lightning_tensor_cores,
                                        "Lightning warns only on a CUDA GPU with tensor cores"),
    "err-torchkeras-model": Live(raise_torchkeras_model, "CPU, torchkeras"),
    # NumPy and Python numbers
    "err-numpy-cuda": Live(raise_numpy_cuda, "meta device as the GPU"),
    "err-numpy-requires-grad": Live(raise_numpy_requires_grad, "CPU"),
    "err-numpy-object": Live(raise_numpy_object, "CPU"),
    "err-item-several-elements": Live(raise_item_several_elements, "CPU"),
    "err-numpy-not-writable": Live(raise_numpy_not_writable, "CPU"),
    # Added by the method of issue 29
    "err-mat-shapes": Live(raise_mat_shapes, "CPU"),
    "err-size-mismatch-broadcast": Live(raise_size_mismatch_broadcast, "CPU"),
    "err-inplace-modified": Live(raise_inplace_modified, "CPU"),
    "err-conv-channels": Live(raise_conv_channels, "CPU"),
    "err-target-out-of-bounds": Live(raise_target_out_of_bounds, "CPU"),
    "err-index-out-of-range": Live(raise_index_out_of_range, "CPU"),
    "err-conv-input-dims": Live(raise_conv_input_dims, "CPU"),
    "err-multi-target": Live(raise_multi_target, "CPU"),
    "err-target-size-broadcast": Live(raise_target_size_broadcast, "CPU"),
    "err-leaf-inplace": Live(raise_leaf_inplace, "CPU"),
    "err-grad-scalar": Live(raise_grad_scalar, "CPU"),
    "err-anomaly-nan": Live(raise_anomaly_nan, "CPU, anomaly detection"),
    "err-inference-tensor": Live(raise_inference_tensor, "CPU"),
    "err-nonleaf-grad": Live(raise_nonleaf_grad, "CPU"),
    "err-empty-parameters": Live(raise_empty_parameters, "CPU"),
    "err-gradscaler-deprecated": Live(raise_gradscaler_deprecated, "CPU"),
    "err-autocast-deprecated": Live(raise_autocast_deprecated, "CPU"),
    "err-lr-scheduler-order": Live(raise_lr_scheduler_order, "CPU"),
    "err-gradscaler-no-cuda": Live(raise_gradscaler_no_cuda, "CPU: no GPU"),
    "err-autocast-no-cuda": Live(raise_autocast_no_cuda, "CPU: no GPU"),
    "err-bf16-unsupported": Files(find_bf16_unsupported, "needs a CUDA GPU that cannot make a "
                                  "bfloat16 tensor"),
    "err-embedding-dtype": Live(raise_embedding_dtype, "CPU"),
    "err-int-requires-grad": Live(raise_int_requires_grad, "CPU"),
    "err-stack-sizes": Live(raise_stack_sizes, "CPU, default_collate"),
    "err-generator-device": Files(find_generator_device, "needs CUDA as the default device (the "
                                  "meta device does not check generators)"),
    "err-too-many-workers": Live(raise_too_many_workers, "CPU, the loader's own check"),
    "err-collate-pil": Live(raise_collate_pil, "CPU, default_collate"),
    "err-pickle-local": Live(raise_pickle_local, "CPU, the pickler spawned workers use"),
    "err-pin-not-dense": Files(find_pin_not_dense, "pinning needs a GPU's tensors and a GPU "
                               "(the meta device words it otherwise, checked live)"),
    "err-pin-memory-thread": Files(find_pin_memory_thread, "the pinning thread runs only "
                                   "where CUDA runs"),
    # Added by the method of issue 29, second batch
    "err-equal-devices": Files(find_equal_devices, GPU_KERNEL),
    "err-cublas-alloc": Files(find_cublas_alloc, GPU_KERNEL + " (cuBLAS)"),
    "err-sync-debug": Files(find_sync_debug, NEEDS_CUDA + " (the sync debug mode)"),
    "err-cublas-no-context": Files(find_cublas_no_context, GPU_KERNEL + " (cuBLAS)"),
    "err-sm-incompatible": Live(raise_sm_incompatible, "torch's own check, told it runs on an "
                                "RTX 5090 with a wheel built up to sm_90"),
    "err-device-count-804": Files(find_device_count_804, NEEDS_CUDA + " (a driver and a GPU "
                                  "without forward compatibility)"),
    "err-xpu-not-compiled": Live(raise_xpu_not_compiled, "CPU"),
    "err-client-socket-timeout": Live(raise_client_socket_timeout, "a store with no server"),
    "err-ddp-no-grad": Live(raise_ddp_no_grad, "one-process gloo group"),
    "err-destroy-process-group": Files(find_destroy_process_group, "NCCL runs only on CUDA GPUs"),
    "err-child-failed": Live(raise_child_failed, "torchrun's report of a worker that exited"),
    "err-no-cxx-compiler": Files(find_no_cxx_compiler, "needs a machine without a C++ compiler, "
                                 "which the test machine has"),
    "err-recompile-limit": Live(raise_recompile_limit, "CPU, torch.compile with the eager backend"),
    "err-triton-out-of-resource": Files(find_triton_out_of_resource, "Triton runs only on a GPU"),
    "err-bf16-compile": Files(find_bf16_compile, "needs a CUDA GPU older than Ampere"),
    "err-lightning-16-mixed-cpu": Live(raise_lightning_16_mixed_cpu, "CPU, Lightning"),
    "err-lightning-num-workers": Files(find_lightning_num_workers, "Lightning warns only when "
                                       "fitting, which the test does not run"),
    "err-lightning-gpu-unused": Files(find_lightning_gpu_unused, "Lightning warns only where "
                                      "a GPU is available"),
    "err-accelerate-defaults": Files(find_accelerate_defaults, "printed by the `accelerate "
                                     "launch` command, which starts a training script"),
    "err-accelerate-kernel": Files(find_accelerate_kernel, "needs a Linux kernel older than 5.5"),
}


# -- the tests --------------------------------------------------------------------------------

# The entries that read the background subprocess come last, so that it runs beside the others.
LATE = ("err-spawn-main", "err-worker-exited", "err-worker-killed", "err-worker-killed-oom",
        "err-compile-prefix", "err-ddp-unused-parameters", "err-ddp-device-ids",
        "err-checkpoint-use-reentrant", "err-checkpoint-no-grad-inputs", *CUDA_CODES)


@pytest.mark.parametrize("label", sorted(set(ENTRIES) - set(LATE)) + list(LATE))
def test_entry(label: str, troubleshooting: dict[str, Entry]) -> None:
    assert label in troubleshooting, f"[{label}] is checked here but the page has no such entry"
    entry = troubleshooting[label]
    check = ENTRIES[label]
    assert entry.kind == check.kind, \
        f"[{label}] the page says '{entry.how}', the test {check.kind} checks it"
    assert entry.version == pinned_torch(), \
        f"[{label}] checked with torch {entry.version}; the book pins torch {pinned_torch()}"
    version = torch.__version__.split("+")[0]
    older = entry.older.get(version, [])
    if check.kind == "macos" and not (LIB / "libtorch_cpu.dylib").exists():
        # The page must not claim a check that this build cannot make: the message is absent.
        message = entry.blocks[0].split(": ", 1)[1]
        fixed = max(re.split(r"\bcpu\b", message), key=len)
        assert fixed.encode() not in rodata(LIB / "libtorch_cpu.so"), \
            f"[{label}] this build holds {fixed!r}: check it as 'found in installed files'"
    if check.kind in ("files", "macos"):
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
    import json, os, sys
    from tests.book import test_troubleshooting as t

    print(t.MARKER + json.dumps(t.older_wordings_report()))
    # Printed: skip the interpreter's teardown of torch (about a CPU-second).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
""")


def older_wordings_report() -> dict[str, str]:
    """Run by the oldest supported torch: each entry's check against the wording the page gives
    for that torch ('' when it holds, else why not)."""
    version = torch.__version__.split("+")[0]
    report = {}
    for label, entry in read_entries().items():
        if version not in entry.older:
            continue
        check = ENTRIES[label]
        try:
            if check.kind in ("files", "macos"):
                check.fn(dataclasses.replace(entry, blocks=entry.older[version]))
                report[label] = ""
            else:
                report[label] = live_mismatch(entry, check.fn())
        except (AssertionError, pytest.skip.Exception) as exc:
            report[label] = f"[{label}] {type(exc).__name__}: {exc}"
    return report


def test_older_wordings_are_what_the_oldest_torch_prints(troubleshooting, request) -> None:
    """The wordings the page gives for the oldest supported torch (what Colab and GPU servers
    with an older torch print), checked by that torch (`make oldest` installs it)."""
    versions = {v for entry in troubleshooting.values() for v in entry.older}
    oldest = oldest_torch()  # a release series ("2.9"): `make oldest` installs its latest
    assert all(v == oldest or v.startswith(f"{oldest}.") for v in versions), \
        f"older wordings for {versions}: only torch {oldest} is checked"
    labels = {label for label, entry in troubleshooting.items() if entry.older}
    assert labels, "the page gives no older wording"
    assert not labels & {"err-spawn-main", "err-worker-exited", "err-compile-prefix",
                         "err-ddp-unused-parameters", "err-ddp-device-ids",
                         "err-checkpoint-use-reentrant", "err-checkpoint-no-grad-inputs"}, \
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


def test_every_entry_is_checked(troubleshooting: dict[str, Entry]) -> None:
    unchecked = sorted(set(troubleshooting) - set(ENTRIES))
    assert not unchecked, f"entries without a check: {unchecked}"
    assert len(troubleshooting) >= MIN_ENTRIES, f"the index has {len(troubleshooting)} entries"


def test_contents_list_links_every_entry_under_its_group(troubleshooting: dict[str, Entry]) -> None:
    text = TROUBLESHOOTING.read_text()
    contents = text[:text.index("\n## ")]
    for entry in troubleshooting.values():
        assert f"<{entry.label}>`" in contents, f"the contents list does not link {entry.label}"
    groups = re.findall(r"^## (.+)$", text, re.M)
    assert len(groups) >= 10
    for group in groups:
        label = re.search(rf"^\((grp-[a-z-]+)\)=\n## {re.escape(group)}$", text, re.M)
        assert label, f"group {group!r} has no (grp-...)= label"
        assert f"<{label[1]}>`" in contents, f"the contents list does not link {group!r}"


def test_each_entry_reads_message_fix_meaning_then_provenance(
        troubleshooting: dict[str, Entry]) -> None:
    """A reader who pasted a message finds, in this order: the message, the fix on its own line,
    a short explanation with the chapter that explains it, and (small) how it was checked."""
    for entry in troubleshooting.values():
        text = entry.text
        quoted = max(m.end() for m in re.finditer(r"```\n(?::::\n)?", text))  # last quote
        fix = re.search(r"^\*\*Fix:\*\* ", text, re.M)
        assert fix and fix.start() > quoted, f"[{entry.label}] no '**Fix:**' line after the message"
        meaning = text[fix.start():text.index("<small>")]
        link = meaning.find("{doc}`")
        assert link > meaning.index("\n\n"), f"[{entry.label}] links no chapter after its fix"
        words = len(meaning.split())
        assert words <= 75, f"[{entry.label}] fix and explanation take {words} words"


def test_links_point_to_chapters_that_exist() -> None:
    links = re.findall(r"\{doc\}`[^`<]*<([^>]+)>`", TROUBLESHOOTING.read_text())
    assert links
    toc = (ROOT / "_toc.yml").read_text()
    for link in set(links):
        assert f"chapters/{link}" in toc, f"{link} is not in the table of contents"
        assert (ROOT / "chapters" / f"{link}.ipynb").exists()


def test_the_tensor_cores_fix_works_with_lightning_and_chapter_3s_way_raises(
        troubleshooting: dict[str, Entry], monkeypatch: pytest.MonkeyPatch) -> None:
    """The Lightning note's fix (err-lightning-tensor-cores) on an Ampere GPU, faked on the CPU:
    Lightning's check reads torch.get_float32_matmul_precision(), which raises once TF32 was
    switched on through fp32_precision (chapter 3 and the cheat sheet's way), and takes the
    older setting the fix names. So the fix names the older one, alone in its process."""
    from lightning.fabric.accelerators import cuda as lightning_cuda

    fix = re.search(r"^\*\*Fix:\*\* (.+)$", troubleshooting["err-lightning-tensor-cores"].text,
                    re.M)[1]
    assert 'torch.set_float32_matmul_precision("high")' in fix and "no `fp32_precision`" in fix
    check = lightning_cuda._check_cuda_matmul_precision.__wrapped__  # not its once-only cache
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    precision, legacy = (torch.backends.cuda.matmul.fp32_precision,
                         torch.get_float32_matmul_precision())
    try:
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
            check(torch.device("cuda", 0))
        torch.backends.cuda.matmul.fp32_precision = precision
        torch.set_float32_matmul_precision("high")
        check(torch.device("cuda", 0))  # no note, no error
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(legacy)
        torch.backends.cuda.matmul.fp32_precision = precision


def test_entries_are_ranked_by_their_evidence(troubleshooting: dict[str, Entry]) -> None:
    """The method of issue 29: tools/troubleshooting-evidence.tsv covers every entry, and
    tools/troubleshooting_rank.py finds the page as the file says (each entry's one 'Seen in'
    line, word for word and just before its own 'Checked with' line, the groups most reported
    first, the contents list in that order); every group opens with an entry some report
    quotes."""
    from tools import troubleshooting_rank as rank

    evidence = rank.read_evidence()
    assert set(evidence) == set(troubleshooting), "the evidence file and the page's entries differ"
    for entry in troubleshooting.values():
        assert entry.text.count("Seen in") == 1, f"[{entry.label}] needs one 'Seen in' line"
    problems = rank.problems(rank.PAGE.read_text(), evidence)
    assert not problems, problems
    groups: dict[str, list[str]] = {}
    for entry in troubleshooting.values():  # in the page's order
        groups.setdefault(entry.group, []).append(entry.label)
    for group, labels in groups.items():
        assert evidence[labels[0]].rank > 0, \
            f"the group {group!r} opens with {labels[0]}, which no report quotes"
    assert sum(1 for row in evidence.values() if row.rank) >= 100
