"""The ``memory`` workload: predicted against measured peak memory of a training step (chapter 13).

Chapter 13 (GPU memory) predicts the peak of one training step on the meta device with
:func:`helpers.memory.predict_training_memory` and checks it against a real run. This
workload records both for each configuration the chapter measures: the chapter 5 CNN at
batch 256 and the wide MLP (SGD and Adam), the MLP with checkpointed blocks, with four
accumulated micro-batches and with ``zero_grad(set_to_none=False)``.

Figures, per configuration ``<name>``: ``<name>_predicted_mib`` (the tensors, replayed on
meta), ``<name>_measured_mib`` and ``<name>_measured_over_predicted``; ``<name>_workspace_mib``
(the largest scratch memory one operation took from the allocator and gave back, measured on
the device: cuDNN's convolution workspace on a GPU, oneDNN's scratchpad on a CPU; the
operation is named in its note) and ``<name>_measured_over_accounted``: the
measured peak over the predicted tensors with each operation's measured workspace added at its
moment (:meth:`helpers.memory.MeasuredStep.with_prediction`). On a CUDA GPU the measurement is
``torch.cuda.max_memory_allocated(device)`` (the MLP 4096 wide at batch 8192); on the CPU the
profiler's allocations (width 512, batch 2048; ``quick=True``: width 128, batch 256).
"""

from __future__ import annotations

from functools import partial

import torch

from bench.core import Figure, workload
from helpers.memory import (
    CUDA_BLOCK,
    WideMLP,
    measurable,
    measure_training_memory,
    predict_training_memory,
)
from helpers.models import MnistCNN

__all__ = ["configurations", "run"]

MiB = 2**20


def configurations(device: torch.device, quick: bool = False) -> dict[str, tuple]:
    """Each measured configuration: (model builder, example shape, batch, keyword arguments)."""
    width, batch = (4096, 8192) if device.type == "cuda" else (512, 2048)
    if quick:
        width, batch = 128, 256
    mlp = partial(WideMLP, width=width)
    return {
        "cnn_adam": (MnistCNN, (1, 28, 28), 256, {"optimizer": "adam"}),
        "mlp_sgd": (mlp, (784,), batch, {"optimizer": "sgd"}),
        "mlp_adam": (mlp, (784,), batch, {"optimizer": "adam"}),
        "mlp_checkpointed_adam": (partial(WideMLP, width=width, checkpoint=True), (784,),
                                  batch, {"optimizer": "adam"}),
        "mlp_accumulate4_adam": (mlp, (784,), batch // 4, {"accumulate": 4}),
        "mlp_keep_grads_adam": (mlp, (784,), batch, {"set_to_none": False}),
    }


@workload("memory", chapter=13)
def run(device: torch.device, *, quick: bool = False) -> list[Figure]:
    """Predicted (meta device) against measured peak memory of one training step."""
    device = measurable(device)  # only CUDA and the CPU record a peak; elsewhere the CPU
    tag = "quick run: " if quick else ""
    round_to = CUDA_BLOCK if device.type == "cuda" else 1
    dev = str(device)
    figures = []
    for name, (build, shape, batch, kw) in configurations(device, quick).items():
        what = f"{tag}batch {batch}, {kw}"
        pred = predict_training_memory(build, shape, batch, round_to=round_to, **kw)
        step = measure_training_memory(build, shape, batch, device, **kw)
        real, accounted = step.peak, step.with_prediction(pred)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        figures += [
            Figure(f"{name}_predicted_mib", pred.peak / MiB, "MiB", dev, None,
                   f"{what}; predicted on the meta device"),
            Figure(f"{name}_measured_mib", real / MiB, "MiB", dev, None,
                   f"{what}; " + ("max_memory_allocated" if device.type == "cuda"
                                  else "CPU profiler's allocations")),
            Figure(f"{name}_measured_over_predicted", real / pred.peak, "x", dev, None,
                   f"{tag}measured / predicted"),
            Figure(f"{name}_workspace_mib", step.workspace / MiB, "MiB", dev, None,
                   f"{tag}largest scratch of one operation, measured: "
                   f"{step.workspace_op or 'none'}"),
            Figure(f"{name}_measured_over_accounted", real / accounted, "x", dev, None,
                   f"{tag}measured / (predicted tensors + each operation's measured "
                   "workspace)"),
        ]
    return figures
