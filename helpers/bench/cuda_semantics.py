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
- ``peak_step_mib_batch256``: peak memory allocated during one training step, batch 256.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from helpers.bench.core import Figure, workload
from helpers.models import MnistCNN
from helpers.timing import benchmark, synchronize

__all__ = ["run"]


def _event_ms(fn) -> float:
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
