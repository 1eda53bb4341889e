"""The ``memory`` benchmark workload (chapter 13), a quick run on the CPU."""

from __future__ import annotations

import math

import torch

from bench import core
from bench import memory as bench_memory

MiB = 2**20


def test_registered() -> None:
    assert core.WORKLOADS["memory"].fn is bench_memory.run
    assert core.WORKLOADS["memory"].chapter == 13


def test_memory_quick_on_cpu() -> None:
    figures = bench_memory.run(torch.device("cpu"), quick=True)
    names = [f.name for f in figures]
    assert len(names) == len(set(names)), names
    configs = bench_memory.configurations(torch.device("cpu"), quick=True)
    assert len(figures) == 5 * len(configs)
    got = {f.name: f for f in figures}
    for name in configs:
        pred, real = got[f"{name}_predicted_mib"], got[f"{name}_measured_mib"]
        ratio = got[f"{name}_measured_over_predicted"]
        assert pred.unit == real.unit == "MiB" and ratio.unit == "x"
        assert math.isclose(ratio.value, real.value / pred.value, rel_tol=1e-12)
        # the predicted tensors with each operation's measured workspace added account for
        # the CPU's peak on any CPU, whatever its thread count: most to the byte,
        # checkpointing's recomputation within 0.1%
        accounted = got[f"{name}_measured_over_accounted"]
        assert accounted.unit == "x" and abs(accounted.value - 1) < 0.001, (name, accounted)
        # without the workspace the prediction is never above the measurement (64 bytes:
        # one-number tensors)
        assert real.value * MiB >= pred.value * MiB - 64, (name, real, pred)
        workspace = got[f"{name}_workspace_mib"]
        assert workspace.unit == "MiB" and workspace.value >= 0
    assert "convolution" in got["cnn_adam_workspace_mib"].note
    for fig in figures:
        assert fig.device == "cpu" and fig.note.startswith("quick run"), fig
