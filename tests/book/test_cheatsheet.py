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
    assert "PYTORCH_ALLOC_CONF=expandable_segments:True" in text


def test_the_skipped_block_uses_only_real_torch_functions():
    """The GPU-only block is not run here: its functions exist, in every supported torch."""
    for _, code, mark in python_blocks():
        if mark and SKIP.fullmatch(mark):
            for name in re.findall(r"\b(torch(?:\.\w+)+)\(", code):
                obj = torch
                for part in name.split(".")[1:]:
                    obj = getattr(obj, part, None)
                    assert obj is not None, f"{name} does not exist in torch {torch.__version__}"
