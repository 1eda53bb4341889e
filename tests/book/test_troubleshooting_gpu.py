"""The troubleshooting entries (chapter 9) whose messages need a CUDA GPU or an Apple GPU,
raised there and compared with the page. Skipped on machines without one; on the CPU,
tests/book/test_troubleshooting.py finds the same messages in torch's installed files.

The tests name their device explicitly (cuda:0, as the page's quotes do), so a BOOK_DEVICE
setting cannot change what they compare."""

from __future__ import annotations

import ast
import builtins
import re
import subprocess
import symtable
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.conftest import ROOT
from tests.support import line, normalise, raised

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
MPS = pytest.mark.skipif(not torch.backends.mps.is_available(), reason="needs an Apple GPU")
GPU = torch.device("cuda:0")

GPU_TESTED: set[str] = set()  # the entries the page marks "GPU test"


def entry_test(label: str, mark):
    def register(fn):
        GPU_TESTED.add(label)
        return mark(pytest.mark.parametrize("label", [label])(fn))
    return register


def quoted(entry) -> list[str]:
    """Every wording the entry quotes: this torch's and the oldest supported one's."""
    return entry.blocks + [b for blocks in entry.older.values() for b in blocks]


def assert_quoted(troubleshooting, label: str, text: str) -> None:
    entry = troubleshooting[label]
    assert normalise(text) in quoted(entry), \
        f"[{label}] {entry.heading}\ntorch {torch.__version__} prints now:\n{text}"


def run_python(code: str) -> subprocess.CompletedProcess:
    """Errors that leave the CUDA context unusable (device-side asserts) or need a fresh process
    (fork) run in their own process."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


# Tensors and modules on different devices

@entry_test("err-same-device", CUDA)
def test_two_devices_in_one_operation(troubleshooting, label):
    exc = raised(lambda: torch.ones(3, device=GPU) + torch.ones(3))
    assert_quoted(troubleshooting, label, line(exc))


@entry_test("err-same-device-argument", CUDA)
def test_linear_on_the_gpu_batch_on_the_cpu(troubleshooting, label):
    model = nn.Linear(4, 2).to(GPU)
    assert_quoted(troubleshooting, label, line(raised(lambda: model(torch.ones(3, 4)))))


@entry_test("err-index-select", CUDA)
def test_embedding_ids_on_the_cpu(troubleshooting, label):
    embedding = nn.Embedding(5, 2).to(GPU)
    assert_quoted(troubleshooting, label, line(raised(lambda: embedding(torch.tensor([1, 2])))))


@entry_test("err-conv-input-type", CUDA)
def test_convolution_on_the_gpu_batch_on_the_cpu(troubleshooting, label):
    # A real batch (8 MNIST digits): a CPU input of 1x1x5x5 takes the plain convolution kernel,
    # which words it otherwise (the entry's third message, checked below with one digit).
    conv = nn.Conv2d(1, 1, 3).to(GPU)
    assert_quoted(troubleshooting, label, line(raised(lambda: conv(torch.ones(8, 1, 28, 28)))))
    cpu_conv = nn.Conv2d(1, 1, 3)  # the reverse: a GPU batch, the model left on the CPU
    exc = raised(lambda: cpu_conv(torch.ones(8, 1, 28, 28, device=GPU)))
    assert_quoted(troubleshooting, label, line(exc))
    one_digit = torch.ones(1, 1, 28, 28)  # model(image.unsqueeze(0)) with chapter 5's first layer
    assert_quoted(troubleshooting, label, line(raised(lambda: conv(one_digit))))


@entry_test("err-rnn-hidden", CUDA)
def test_rnn_hidden_state_on_the_cpu(troubleshooting, label):
    rnn = nn.RNN(10, 5).to(GPU)
    exc = raised(lambda: rnn(torch.randn(4, 3, 10, device=GPU), torch.zeros(1, 3, 5)))
    assert_quoted(troubleshooting, label, line(exc))


@entry_test("err-rnn-input", CUDA)
def test_rnn_input_on_the_cpu(troubleshooting, label):
    rnn = nn.RNN(10, 5).to(GPU)
    assert_quoted(troubleshooting, label, line(raised(lambda: rnn(torch.randn(4, 3, 10)))))


@entry_test("err-numpy-cuda", CUDA)
def test_numpy_of_a_gpu_tensor(troubleshooting, label):
    assert_quoted(troubleshooting, label, line(raised(lambda: torch.ones(2, device=GPU).numpy())))


# CUDA runtime errors

@entry_test("err-device-side-assert", CUDA)
def test_device_side_assert(troubleshooting, label):
    run = run_python("""
        import torch
        import torch.nn.functional as F

        logits = torch.zeros(4, 10, device="cuda:0")
        labels = torch.tensor([1, 2, 12, 3], device="cuda:0")  # 12 is not a class
        loss = F.cross_entropy(logits, labels)
        torch.cuda.synchronize("cuda:0")
        print(loss.item())
    """)
    assert run.returncode != 0
    # The kernel's own 'Assertion ... failed' lines come first; then the quoted message.
    assert any(block in normalise(run.stderr) for block in quoted(troubleshooting[label])), \
        f"[{label}] torch {torch.__version__} prints now:\n{run.stderr[-3000:]}"


@entry_test("err-invalid-device-ordinal", CUDA)
def test_a_gpu_that_is_not_there(troubleshooting, label):
    missing = torch.device("cuda", torch.cuda.device_count())
    assert_quoted(troubleshooting, label, line(raised(lambda: torch.zeros(1, device=missing))))


# Memory

SIZE = r"(?:\d+\.\d+ [KMG]iB|\d+ bytes)"  # c10's format_size: bytes up to 1 MiB
PROCESSES = rf"(?:(?:Process \d+|Including non-PyTorch memory, this process) has {SIZE} memory in use\. )*"
LINKS = (r"\((?:https://docs\.pytorch\.org/docs/stable/notes/cuda\.html"
         r"#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"
         r"|https://pytorch\.org/docs/stable/notes/cuda\.html#environment-variables)\)")


def size_pattern(quote: str) -> re.Pattern:
    """The quote with what varies left open: sizes; the processes NVML lists on the GPU, in its
    order (this one as 'Including non-PyTorch memory, this process', or in a container as
    'Process N' like the others; none without NVML); the documentation link (torch 2.9's
    differs)."""
    head, sep, rest = quote.partition(" is free. ")
    assert sep, quote
    rest = re.sub(r"^(?:(?:Process \d+|Including non-PyTorch memory, this process) has \S+ \S+ "
                  r"memory in use\. )*", "", rest)  # the example run's processes
    rest = rest[:rest.rindex("  (")]  # the link

    def fixed(text: str) -> str:
        return re.sub(r"\d+\\\.\d+\\ [KMG]iB", lambda _: SIZE, re.escape(text))

    return re.compile(fixed(head + sep) + PROCESSES + fixed(rest) + "  " + LINKS)


@entry_test("err-cuda-oom", CUDA)
def test_cuda_out_of_memory(troubleshooting, label):
    total = torch.cuda.get_device_properties(GPU).total_memory
    exc = raised(lambda: torch.empty(total * 2, dtype=torch.uint8, device=GPU))
    assert isinstance(exc, torch.OutOfMemoryError)
    assert size_pattern(troubleshooting[label].blocks[0]).fullmatch(line(exc)), \
        f"[{label}] torch {torch.__version__} prints now:\n{line(exc)}"


@entry_test("err-cuda-oom-fraction", CUDA)
def test_cuda_out_of_memory_under_a_memory_fraction(troubleshooting, label):
    total = torch.cuda.get_device_properties(GPU).total_memory
    torch.cuda.set_per_process_memory_fraction(0.05, GPU)
    try:
        exc = raised(lambda: torch.empty(total // 10, dtype=torch.uint8, device=GPU))
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, GPU)
    assert isinstance(exc, torch.OutOfMemoryError)
    assert size_pattern(troubleshooting[label].blocks[0]).fullmatch(line(exc)), \
        f"[{label}] torch {torch.__version__} prints now:\n{line(exc)}"


# DataLoader workers and multiprocessing

@entry_test("err-forked-cuda", CUDA)
def test_cuda_in_a_forked_child(troubleshooting, label):
    run = run_python("""
        import multiprocessing as mp
        import torch

        def child():
            try:
                torch.zeros(1, device="cuda:0")
            except RuntimeError as exc:
                print(f"{type(exc).__name__}: {exc}")

        torch.zeros(1, device="cuda:0")  # CUDA starts in the parent
        p = mp.get_context("fork").Process(target=child)
        p.start()
        p.join()
    """)
    assert run.returncode == 0, run.stderr
    assert_quoted(troubleshooting, label, run.stdout.strip())


# Apple MPS

@entry_test("err-mps-linear-device", MPS)
def test_mps_layer_left_on_the_cpu(troubleshooting, label):
    layer = nn.Linear(4, 2)  # made in forward, or kept in a plain list: never moved
    exc = raised(lambda: layer(torch.ones(3, 4, device="mps")))
    assert_quoted(troubleshooting, label, line(exc))


@entry_test("err-mps-placeholder", MPS)
def test_mps_class_weights_on_the_cpu(troubleshooting, label):
    loss = nn.CrossEntropyLoss(weight=torch.ones(3))  # class weights left on the CPU
    logits = torch.randn(4, 3, device="mps")
    target = torch.tensor([0, 1, 2, 0], device="mps")
    assert_quoted(troubleshooting, label, line(raised(lambda: loss(logits, target))))


@entry_test("err-mps-float64", MPS)
def test_mps_float64(troubleshooting, label):
    exc = raised(lambda: torch.ones(2, dtype=torch.float64).to("mps"))
    assert_quoted(troubleshooting, label, line(exc))


@entry_test("err-mps-not-implemented", MPS)
def test_mps_operator_not_implemented(troubleshooting, label, monkeypatch):
    monkeypatch.delenv("PYTORCH_ENABLE_MPS_FALLBACK", raising=False)
    try:
        torch.special.airy_ai(torch.ones(2, device="mps"))
    except NotImplementedError as exc:
        quoted = troubleshooting[label].blocks[0].removesuffix(" ...")
        assert line(exc).startswith(quoted), \
            f"[{label}] torch {torch.__version__} prints now:\n{line(exc)}"
    else:
        pytest.fail(f"[{label}] this torch runs airy_ai on MPS: quote another operator")


def test_every_gpu_tested_entry_says_so(troubleshooting) -> None:
    marked = {label for label, entry in troubleshooting.items()
              if entry.how.endswith("GPU test")}
    assert marked == GPU_TESTED, (sorted(marked - GPU_TESTED), sorted(GPU_TESTED - marked))


def test_subprocess_code_compiles_and_names_only_what_it_defines() -> None:
    """The code each test above runs in a child process is only text here: parse it, and check
    that every global name it reads is imported, assigned or built in (runs without a GPU)."""
    tree = ast.parse(Path(__file__).read_text())
    codes = [node.args[0].value for node in ast.walk(tree)
             if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "run_python"
             and node.args and isinstance(node.args[0], ast.Constant)]
    assert codes, "no run_python(...) code found"
    for code in codes:
        source = textwrap.dedent(code)
        compile(source, "<child>", "exec")
        top = symtable.symtable(source, "<child>", "exec")
        defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
        tables, used = [top], set()
        while tables:
            table = tables.pop()
            tables += table.get_children()
            used |= {s.get_name() for s in table.get_symbols()
                     if s.is_referenced() and (s.is_global() or table is top)}
        unknown = used - defined - set(dir(builtins))
        assert not unknown, f"the child code uses {sorted(unknown)} without defining them:\n{source}"
