"""The cheat sheet (chapters/cheatsheet.md) runs, agrees with the chapters and covers the book.

Every ```python block is executed on the CPU, in a fresh namespace holding what a chapter's
setup makes (`torch`, `nn`, `device`, `model`, `loader`, `optimizer`, ...). A line
``% test: <how>`` right before a block (a MyST comment: the page does not show it) says how
else to run it:

- ``% test: skip: needs a CUDA GPU (...)``: not run here, with that reason;
- ``% test: in a process group (...)``: run inside a one-process gloo group.

A block that neither runs nor carries one of these marks fails the test.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.conftest import ROOT
from tests.support import toc_files

CHEATSHEET = ROOT / "chapters" / "cheatsheet.md"
BLOCK = re.compile(r"(?:^% test: (?P<mark>[^\n]+)\n)?^```(?P<lang>[\w-]*)\n(?P<code>.*?)^```$",
                   re.M | re.S)
SKIP = re.compile(r"skip: (?P<reason>needs a CUDA GPU .+)")
GROUP = re.compile(r"in a process group\b")


def blocks() -> list[tuple[int, str, str, str | None]]:
    """(line, language, code, mark) of each fenced block."""
    text = CHEATSHEET.read_text()
    return [(text.count("\n", 0, m.start("code")), m["lang"], m["code"], m["mark"])
            for m in BLOCK.finditer(text)]


def python_blocks() -> list[tuple[int, str, str | None]]:
    return [(line, code, mark) for line, lang, code, mark in blocks() if lang == "python"]


def code_text() -> str:
    return "\n".join(code for _, code, _ in python_blocks())


def setup_namespace() -> dict:
    """What a chapter's setup cell leaves behind, small enough to run in a moment."""
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    loader = DataLoader(dataset, batch_size=16, drop_last=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    x, y = next(iter(loader))
    torch.save(model.state_dict(), "model.pt")  # for the block that loads a checkpoint
    return {
        "torch": torch, "nn": nn, "time": time, "DataLoader": DataLoader,
        "device": torch.device("cpu"), "dataset": dataset, "loader": loader, "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "loss_fn": nn.CrossEntropyLoss(), "x": x, "y": y,
        "a": torch.randn(64, 64), "b": torch.randn(64, 64),
    }


@pytest.fixture
def restored(tmp_path, monkeypatch):
    """A scratch folder as the working directory; torch's global settings put back after."""
    monkeypatch.chdir(tmp_path)
    precision = torch.backends.cuda.matmul.fp32_precision
    threads = torch.get_num_threads()
    yield tmp_path
    torch.backends.cuda.matmul.fp32_precision = precision
    torch.set_num_threads(threads)
    torch._dynamo.reset()


def test_the_sheet_has_blocks_and_known_marks():
    found = python_blocks()
    assert len(found) >= 12, f"only {len(found)} python blocks"
    for line, _, mark in found:
        assert mark is None or SKIP.fullmatch(mark) or GROUP.match(mark), \
            f"line {line}: unknown mark {mark!r} (skip: needs a CUDA GPU (...) | in a process group)"
    for line, lang, _, _ in blocks():
        assert lang in ("python", "bash"), f"line {line}: a ```{lang} block (python or bash only)"


@pytest.mark.parametrize("line, code, mark", python_blocks(),
                         ids=[f"line{line}" for line, _, _ in python_blocks()])
def test_a_block_runs(line, code, mark, restored):
    if mark and (skip := SKIP.fullmatch(mark)):
        pytest.skip(skip["reason"])
    namespace = setup_namespace()
    if mark and GROUP.match(mark):
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{restored / 'group'}",
                                rank=0, world_size=1)
        try:
            exec(compile(code, f"cheatsheet.md:{line}", "exec"), namespace)
        finally:
            dist.destroy_process_group()
    else:
        exec(compile(code, f"cheatsheet.md:{line}", "exec"), namespace)


def test_it_agrees_with_the_chapters():
    code = code_text()
    # Chapter 2: non_blocking only from pinned memory to a CUDA GPU, so never unconditionally.
    assert "non_blocking=True" not in code, "non_blocking=True on every device (chapter 2: pin)"
    assert "non_blocking=pin" in code and 'pin = device.type == "cuda"' in code
    # Chapter 3: Timer's default of one thread is a trap, and its clock waits for one GPU only.
    for call in re.findall(r"benchmark\.Timer\((.*?)\)\n", code, re.S):
        assert "num_threads=torch.get_num_threads()" in call, call
        assert "timer=" in call, call
    # Chapter 3: TF32 through fp32_precision alone, never mixed with the older switches.
    assert 'fp32_precision = "tf32"' in code
    assert "set_float32_matmul_precision(" not in code and "allow_tf32" not in code
    # Chapter 12: the scaler unscales before clipping, and steps after.
    amp = next(c for _, c, _ in python_blocks() if "GradScaler" in c)
    order = [amp.index(s) for s in ("scaler.scale(loss).backward()", "scaler.unscale_(optimizer)",
                                    "clip_grad_norm_", "scaler.step(optimizer)",
                                    "scaler.update()")]
    assert order == sorted(order), "scale, backward, unscale_, clip, step, update"
    assert "enabled=fp16" in amp and "torch.bfloat16" in amp, "bf16 runs without a scaler"


def amp_block() -> str:
    return next(c for _, c, _ in python_blocks() if "GradScaler" in c)


@pytest.mark.parametrize("device, capability, fp16", [
    ("cuda", (7, 5), True),    # a T4: no fast bf16, and is_bf16_supported() says True
    ("cuda", (7, 0), True),    # a V100
    ("cuda", (8, 0), False),   # an A100: bf16
    ("cuda", (9, 0), False),   # an H100 or H200
    ("cpu", None, False), ("mps", None, False), ("xpu", None, False),
])
def test_the_amp_loop_picks_fp16_exactly_below_compute_capability_8(
        device, capability, fp16, monkeypatch):
    """The loop's own test of the device (its first line), on the devices the book names."""
    first = amp_block().splitlines()[0]
    assert first.startswith("fp16 = "), first

    def get_device_capability(d):
        assert torch.device(d).type == "cuda", "asked the capability of a non-CUDA device"
        return capability

    monkeypatch.setattr(torch.cuda, "get_device_capability", get_device_capability)
    namespace = {"torch": torch, "device": torch.device(device, 0)}
    exec(first, namespace)
    assert namespace["fp16"] is fp16


def test_the_amp_loop_runs_its_fp16_branch_with_the_scaler(restored):
    """The loop as a T4 runs it (float16 autocast, an enabled GradScaler), here on the CPU,
    where torch's GradScaler and float16 autocast work too: the scaler scales and steps."""
    first, *rest = amp_block().splitlines()
    namespace = setup_namespace()
    before = [p.detach().clone() for p in namespace["model"].parameters()]
    exec(compile("\n".join(["fp16 = True", *rest]), "cheatsheet.md:amp-fp16", "exec"),
         namespace)
    scaler = namespace["scaler"]
    assert scaler.is_enabled() and scaler.get_scale() > 1, "the loss was not scaled"
    after = list(namespace["model"].parameters())
    assert any(not torch.equal(b, a) for b, a in zip(before, after, strict=True)), \
        "the scaler skipped every step"


@pytest.mark.parametrize("what", [
    "torch.amp.GradScaler", "torch.autocast", "torch.cuda.memory_summary",
    "torch.cuda.memory._record_memory_history", "torch.cuda.memory._dump_snapshot",
    "torch.no_grad()", "torch.inference_mode()", "sampler.set_epoch(epoch)", "torch.compile(",
    "map_location=device", "torch.accelerator.synchronize(device)", ".chunk(k)",
])
def test_it_covers_part_iv_too(what):
    text = CHEATSHEET.read_text()
    assert what in text, f"the cheat sheet never shows {what}"


def test_it_links_every_chapter():
    text = CHEATSHEET.read_text()
    chapters = [Path(f).name for f in toc_files() if re.match(r"chapters/\d\d_", f)]
    missing = [c for c in chapters if f"<{c}>" not in text]
    assert not missing, f"chapters the cheat sheet never links: {missing}"
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in text


def allocator_headers() -> list[Path]:
    """c10/cuda/CUDAAllocatorConfig.h of this torch and of every torch installed beside the
    book (``make oldest``'s .venv-oldest holds the oldest supported one)."""
    found = {Path(torch.__file__).parent / "include/c10/cuda/CUDAAllocatorConfig.h"}
    found |= set(ROOT.glob(".venv*/lib/python3*/site-packages/torch/include/c10/cuda/"
                           "CUDAAllocatorConfig.h"))
    return sorted(f for f in found if f.exists())


@pytest.mark.parametrize("page", ["cheatsheet.md", "symptoms.md", "09_troubleshooting.md"])
def test_the_allocator_variable_taught_is_one_the_cuda_allocator_reads(page):
    """Torch 2.9 warns that PYTORCH_CUDA_ALLOC_CONF is deprecated (c10/core/AllocatorConfig.cpp
    parses PYTORCH_ALLOC_CONF first), yet its CUDA caching allocator reads only the old name:
    a reader told to set PYTORCH_ALLOC_CONF=expandable_segments:True there gets nothing. The
    variable a page tells the reader to set expandable_segments with is read by the CUDA
    allocator of every torch installed here (its header's ``get_env`` calls)."""
    headers = allocator_headers()
    assert headers, "no c10/cuda/CUDAAllocatorConfig.h in the installed torch"
    text = (ROOT / "chapters" / page).read_text()
    taught = set(re.findall(r"`(PYTORCH_\w*ALLOC_CONF)=expandable_segments:True`", text))
    assert taught, f"{page} does not say how to set expandable_segments"
    for header in headers:
        read = set(re.findall(r'get_env\("(PYTORCH_\w+)"\)', header.read_text()))
        assert "PYTORCH_CUDA_ALLOC_CONF" in read, header
        assert taught <= read, f"{page} teaches {taught - read}, which {header} never reads"


def test_the_skipped_block_calls_real_torch_functions_as_they_take_arguments():
    """The GPU-only block is not run here: each torch function it calls exists in this torch
    and accepts the arguments it is given (names and number, bound to its signature)."""
    import ast
    import inspect

    skipped = [code for _, code, mark in python_blocks() if mark and SKIP.fullmatch(mark)]
    assert skipped
    calls = 0
    for code in skipped:
        for node in ast.walk(ast.parse(code)):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            if not name.startswith("torch."):
                continue
            obj = torch
            for part in name.split(".")[1:]:
                obj = getattr(obj, part, None)
                assert obj is not None, f"{name} does not exist in torch {torch.__version__}"
            args = [None] * len(node.args)
            kwargs = {k.arg: None for k in node.keywords}
            try:
                inspect.signature(obj).bind(*args, **kwargs)
            except TypeError as exc:
                raise AssertionError(f"{ast.unparse(node)}: {exc}") from None
            calls += 1
    assert calls >= 4, calls
