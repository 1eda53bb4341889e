"""The ``memory`` benchmark workload (chapter 13), a quick run on the CPU."""

from __future__ import annotations

import math

import torch

from bench import core
from bench import memory as bench_memory


def test_registered() -> None:
    assert core.WORKLOADS["memory"].fn is bench_memory.run
    assert core.WORKLOADS["memory"].chapter == 13


def test_memory_quick_on_cpu() -> None:
    figures = bench_memory.run(torch.device("cpu"), quick=True)
    names = [f.name for f in figures]
    assert len(names) == len(set(names)), names
    configs = bench_memory.configurations(torch.device("cpu"), quick=True)
    assert len(figures) == 3 * len(configs)
    got = {f.name: f for f in figures}
    for name in configs:
        pred, real = got[f"{name}_predicted_mib"], got[f"{name}_measured_mib"]
        ratio = got[f"{name}_measured_over_predicted"]
        assert pred.unit == real.unit == "MiB" and ratio.unit == "x"
        assert math.isclose(ratio.value, real.value / pred.value, rel_tol=1e-12)
        # measured on the CPU: most to the byte, checkpointing and quick sizes within 0.5%
        assert abs(ratio.value - 1) < 0.005, (name, ratio.value)
    for fig in figures:
        assert fig.device == "cpu" and fig.note.startswith("quick run"), fig
