"""The ``cuda_semantics`` workload: the CUDA behaviours chapter 11 demonstrates, measured.

Chapter 11 (CUDA semantics) shows each of these on a GPU; a reader without one sees these
committed figures instead. Only the first two figures are measured on other devices too
(where the call returns only once the work is done, so the two agree); the rest need CUDA.

- ``launch_ms`` / ``matmul_done_ms``: a large matrix product, the call alone and the call
  followed by ``torch.cuda.synchronize()`` (asynchronous execution);
- ``serial_copy_compute_ms`` / ``overlapped_copy_compute_ms``: a pinned host-to-device copy and
  matrix products on one stream, then with the copy on a second stream (CUDA events);
- ``eager_step_ms`` / ``graph_replay_ms`` / ``graph_speedup``: a training step of the chapter 5
  CNN (batch 64), launched op by op and replayed from a CUDA graph;
- ``peak_step_mib_batch256``: peak memory allocated during one training step, batch 256;
- ``async_error_lines_late`` / ``launch_blocking_error_lines_late``: how many lines after the
  faulty call a device-side assert is reported, without and with ``CUDA_LAUNCH_BLOCKING=1``
  (:func:`async_error_report`, which chapter 11 also runs).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch
from torch import nn

from helpers.bench.core import Figure, workload
from helpers.models import MnistCNN
from helpers.timing import benchmark, synchronize

__all__ = ["ASYNC_ERROR_SCRIPT", "AsyncErrorReport", "async_error_report", "run"]

#: A script whose cross-entropy gets a target class that does not exist (10 of classes 0-9).
#: On a CUDA GPU the kernel's device-side assert fires while Python has already moved on; on
#: the CPU the same call raises ``IndexError: Target 10 is out of bounds.`` at once.
ASYNC_ERROR_SCRIPT = """\
import sys
import torch

device = torch.device(sys.argv[1])
logits = torch.randn(64, 10, device=device)
target = torch.full((64,), 10, device=device)  # classes are 0..9: 10 is out of range
if device.type == "cuda":
    busy = torch.randn(4096, 4096, device=device)
    for _ in range(20):  # tens of milliseconds of queued work: the faulty kernel starts late
        torch.mm(busy, busy)
loss = torch.nn.functional.cross_entropy(logits, target)  # the faulty call
print("the faulty call returned", flush=True)
print("loss:", loss.item())  # the first call that waits for the GPU
"""


@dataclass(frozen=True)
class AsyncErrorReport:
    """Where :data:`ASYNC_ERROR_SCRIPT` failed (chapter 11): the faulty call's line, the line
    Python's traceback blames, the error's first line, and what the script printed before."""

    faulty_line: int
    reported_line: int
    error: str
    printed: str

    @property
    def lines_late(self) -> int:
        """How many lines after the faulty call the error surfaced (0: at the call itself)."""
        return self.reported_line - self.faulty_line


def async_error_report(device: torch.device | str, *, launch_blocking: bool = False,
                       timeout: float = 300) -> AsyncErrorReport:
    """Run :data:`ASYNC_ERROR_SCRIPT` on ``device`` in a fresh process and report where it failed
    (chapter 11).

    A separate process, because a device-side assert leaves the CUDA context unusable for the
    rest of the process. ``launch_blocking`` sets ``CUDA_LAUNCH_BLOCKING=1``, which makes every
    kernel launch wait for the kernel, so the error is raised at the faulty call.
    """
    device = torch.device(device)
    if device.type == "meta":
        raise ValueError("the meta device runs no kernels; pass 'cpu' or a CUDA device")
    faulty = next(i for i, line in enumerate(ASYNC_ERROR_SCRIPT.splitlines(), start=1)
                  if line.endswith("# the faulty call"))
    env = {k: v for k, v in os.environ.items() if k != "CUDA_LAUNCH_BLOCKING"}
    if launch_blocking:
        env["CUDA_LAUNCH_BLOCKING"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "faulty_target.py")
        with open(script, "w") as fh:
            fh.write(ASYNC_ERROR_SCRIPT)
        proc = subprocess.run([sys.executable, script, str(device)], capture_output=True,
                              text=True, timeout=timeout, env=env)
    if proc.returncode == 0:
        raise RuntimeError(f"the faulty script ran to the end on {device}; expected an error. "
                           f"It printed:\n{proc.stdout}")
    lines = [int(n) for n in re.findall(rf'File "{re.escape(script)}", line (\d+)', proc.stderr)]
    errors = [line for line in proc.stderr.splitlines() if re.match(r"^[A-Za-z_.]*(Error|Exception): ", line)]
    if not lines or not errors:
        raise RuntimeError(f"could not find the failing line in the script's error output:\n"
                           f"{proc.stderr[-3000:]}")
    return AsyncErrorReport(faulty_line=faulty, reported_line=lines[-1], error=errors[-1],
                            printed=proc.stdout)


def _event_ms(fn) -> float:
    """Milliseconds of GPU time for ``fn`` on the current CUDA device's current stream."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


@workload("cuda_semantics", chapter=11)
def run(device: torch.device, *, quick: bool) -> list[Figure]:
    """Asynchronous launch, copy/compute overlap, CUDA graph replay and peak step memory."""
    device = torch.device(device)
    dev = str(device)
    note = "quick run" if quick else ""
    figs: list[Figure] = []

    if device.type == "cuda":
        size = 4096 if quick else 8192
    else:
        size = 512 if quick else 1024
    a = torch.randn(size, size, device=device)
    for _ in range(3):
        a @ a
    synchronize(device)
    launch, done = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        a @ a
        launch.append(time.perf_counter() - t0)
        synchronize(device)
        done.append(time.perf_counter() - t0)
    figs.append(Figure("launch_ms", statistics.median(launch) * 1e3, "ms", dev,
                       note=f"{note} {size}x{size} fp32 product, call only".strip()))
    figs.append(Figure("matmul_done_ms", statistics.median(done) * 1e3, "ms", dev,
                       note=f"{note} same product, call + synchronize".strip()))
    if device.type != "cuda":
        return figs
    # Streams, events and memory statistics below act on the *current* CUDA device: make it
    # the one being measured (cuda:1 on a two-GPU machine, when asked).
    with torch.cuda.device(device):
        figs += _cuda_figures(device, quick=quick, note=note)
    for blocking, name in ((False, "async_error_lines_late"), (True, "launch_blocking_error_lines_late")):
        report = async_error_report(device, launch_blocking=blocking)
        figs.append(Figure(name, float(report.lines_late), "lines", dev,
                           note=f"{note} device-side assert; reported: {report.error[:80]}".strip()))
    return figs


def _cuda_figures(device: torch.device, *, quick: bool, note: str) -> list[Figure]:
    dev = str(device)
    figs: list[Figure] = []
    host = torch.randn((16 if quick else 64) * 2**20, pin_memory=True)
    m = torch.randn(4096, 4096, device=device)
    side = torch.cuda.Stream()
    copy_ms = min(_event_ms(lambda: host.to(device, non_blocking=True)) for _ in range(3))
    mm_ms = min(_event_ms(lambda: m @ m) for _ in range(3))
    reps = max(1, round(copy_ms / mm_ms))

    def compute():
        for _ in range(reps):
            m @ m

    def serial():
        host.to(device, non_blocking=True)
        compute()

    def overlapped():
        side.wait_stream(torch.cuda.current_stream())  # the default stream, before switching
        with torch.cuda.stream(side):
            on_device = host.to(device, non_blocking=True)
        compute()
        torch.cuda.current_stream().wait_stream(side)
        on_device.record_stream(torch.cuda.current_stream())

    mib = host.nbytes // 2**20
    figs.append(Figure("serial_copy_compute_ms", min(_event_ms(serial) for _ in range(3)), "ms",
                       dev, note=f"{note} {mib} MiB pinned copy + {reps} 4096^2 products, one stream".strip()))
    figs.append(Figure("overlapped_copy_compute_ms", min(_event_ms(overlapped) for _ in range(3)),
                       "ms", dev, note=f"{note} the copy on a second stream".strip()))

    torch.manual_seed(0)
    model = MnistCNN().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(64, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (64,), device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    run_time = 0.3 if quick else 2.0
    eager = benchmark(step, device=device, min_run_time=run_time)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss_fn(model(x), y).backward()
        opt.step()
    replay = benchmark(graph.replay, device=device, min_run_time=run_time)
    step_note = f"{note} MnistCNN training step, SGD, batch 64".strip()
    figs.append(Figure("eager_step_ms", eager.median * 1e3, "ms", dev, eager.iqr * 1e3, step_note))
    figs.append(Figure("graph_replay_ms", replay.median * 1e3, "ms", dev, replay.iqr * 1e3, step_note))
    figs.append(Figure("graph_speedup", eager.median / replay.median, "x", dev, note=step_note))
    del graph

    model = MnistCNN().to(device)
    adam = torch.optim.Adam(model.parameters())
    xb = torch.randn(256, 1, 28, 28, device=device)
    yb = torch.randint(0, 10, (256,), device=device)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss_fn(model(xb), yb).backward()
    adam.step()
    torch.cuda.synchronize()
    figs.append(Figure("peak_step_mib_batch256", (torch.cuda.max_memory_allocated() - before) / 2**20,
                       "MiB", dev, note=f"{note} MnistCNN, Adam, first step".strip()))
    return figs
