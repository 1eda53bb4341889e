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

import statistics
import time

import torch
from torch import nn

from bench.core import Figure, workload
from helpers.cuda_semantics import async_error_reports, copy_compute_overlap
from helpers.models import MnistCNN
from helpers.timing import benchmark, synchronize

__all__ = ["EAGER_MIN_RUN_TIME", "REPLAY_MIN_RUN_TIME", "run"]

# ``helpers.timing.benchmark`` times blocks of calls, each ten times the last until it passes
# ``min_run_time`` (or its clock's own cost, a synchronisation, is under 0.01% of it), and at
# least five blocks. Full runs (quick: 0.3 s each):
#: the eager step (1.6 ms on an H200, launch-bound, its spread the host's jitter): five or
#: more blocks of 100 steps, as the former 2 s window made them, in about a second;
EAGER_MIN_RUN_TIME = 0.3
#: the graph's replay (0.31 ms, spread 0.01%): five blocks of 100 replays (the former 2 s
#: made blocks of 1,000, about 2.5 s of replays).
REPLAY_MIN_RUN_TIME = 0.01


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
    return figs + _async_error_figures(device, note)


def _async_error_figures(device: torch.device, note: str) -> list[Figure]:
    """Where a device-side assert is reported, without and with ``CUDA_LAUNCH_BLOCKING=1``:
    the two fresh processes side by side (:func:`async_error_reports`), as chapter 11 runs
    them, so the pair costs one process's start-up, not two."""
    late, blocking = async_error_reports(device)
    return [Figure(name, float(report.lines_late), "lines", str(device),
                   note=f"{note} device-side assert; reported: {report.error[:80]}".strip())
            for report, name in ((late, "async_error_lines_late"),
                                 (blocking, "launch_blocking_error_lines_late"))]


def _cuda_figures(device: torch.device, *, quick: bool, note: str) -> list[Figure]:
    dev = str(device)
    figs: list[Figure] = []
    overlap = copy_compute_overlap(device, mib=64 if quick else 256)
    what = f"{overlap.mib} MiB pinned copy + {overlap.products} 4096^2 products"
    figs.append(Figure("serial_copy_compute_ms", overlap.serial_ms, "ms", dev,
                       note=f"{note} {what}, one stream".strip()))
    figs.append(Figure("overlapped_copy_compute_ms", overlap.overlapped_ms, "ms", dev,
                       note=f"{note} the copy on a second stream".strip()))

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

    s = torch.cuda.Stream(device=device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream(device).wait_stream(s)
    eager = benchmark(step, device=device, min_run_time=0.3 if quick else EAGER_MIN_RUN_TIME)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss_fn(model(x), y).backward()
        opt.step()
    replay = benchmark(graph.replay, device=device,
                       min_run_time=0.3 if quick else REPLAY_MIN_RUN_TIME)
    step_note = f"{note} MnistCNN training step, SGD, batch 64".strip()
    figs.append(Figure("eager_step_ms", eager.median * 1e3, "ms", dev, eager.iqr * 1e3, step_note))
    figs.append(Figure("graph_replay_ms", replay.median * 1e3, "ms", dev, replay.iqr * 1e3, step_note))
    figs.append(Figure("graph_speedup", eager.median / replay.median, "x", dev, note=step_note))
    del graph

    model = MnistCNN().to(device)
    adam = torch.optim.Adam(model.parameters())
    xb = torch.randn(256, 1, 28, 28, device=device)
    yb = torch.randint(0, 10, (256,), device=device)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    loss_fn(model(xb), yb).backward()
    adam.step()
    torch.cuda.synchronize(device)
    figs.append(Figure("peak_step_mib_batch256", (torch.cuda.max_memory_allocated(device) - before) / 2**20,
                       "MiB", dev, note=f"{note} MnistCNN, Adam, first step".strip()))
    return figs
