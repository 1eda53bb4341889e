"""The ``mnist`` workload: how fast chapter 5's CNN trains, and what the data path costs (chapter 5).

Chapter 5 (MNIST, CPU vs GPU) trains the CNN of Wang Zhefeng's tutorial *PyTorch 训练模型 GPU*
with that tutorial's DataLoader (``ToTensor()`` on every PIL image, batch 128, no worker processes) and then with the
whole dataset kept on the device as one tensor, batched by indexing
(:func:`helpers.data.mnist_tensors` + :class:`helpers.data.TensorBatches`). This module measures
the same two paths for the book's benchmark command, with the same model, optimiser (Adam),
batch size and training epoch (:func:`helpers.training.train_epoch`), so the two differ only in
where the batches come from: decoded by the DataLoader and copied to the device at every step
(``non_blocking`` on CUDA, from pageable memory), or indexed on the device.

Figures (``quick=False``; ``quick=True`` trains on a small subset and says so in each note):

- always, on the CPU: ``cpu_tutorial_loader_images_per_s``, ``cpu_resident_images_per_s`` and
  their ratio ``cpu_resident_over_tutorial_loader`` (one training epoch each; on the CPU a subset of
  :data:`CPU_IMAGES` images, since the rate does not depend on how many there are);
- on an accelerator: ``tutorial_loader_images_per_s``, ``resident_images_per_s`` and
  ``resident_over_tutorial_loader``, each over one training epoch of the first
  :data:`GPU_IMAGES` images after a warm-up (a third of the full epoch: the rate does not
  depend on how many images there are, and the DataLoader's full epoch took an H200 3.4 s);
- full runs only, on the device the run is for: ``seconds_to_target`` (training seconds, device
  synchronised, evaluation excluded, until the test accuracy reaches :data:`TARGET_ACCURACY` on
  the device-resident path, Adam with the learning rate multiplied by :data:`LR_DECAY` after
  every epoch) and ``test_accuracy_at_stop``. On the CPU the training stops after
  :data:`CPU_BUDGET_S` seconds; the note says whether the target was reached.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset

from bench.core import Figure, workload
from helpers.data import TensorBatches, mnist, mnist_tensors
from helpers.models import MnistCNN
from helpers.timing import timed

# helpers.training (train_epoch, evaluate) is imported where it is used: it imports
# torchmetrics, and with it torchvision's models and torch._dynamo (seconds), which
# `python -m bench --list` and the other workloads do not need.

__all__ = ["BATCH_SIZE", "CPU_BUDGET_S", "CPU_IMAGES", "GPU_IMAGES", "LR", "LR_DECAY",
           "TARGET_ACCURACY", "run", "tutorial_loader", "time_to_accuracy", "train_images_per_s"]

#: The tutorial's batch size, used by both paths.
BATCH_SIZE = 128
#: Adam's starting learning rate for every run of this workload.
LR = 5e-3
#: The time-to-accuracy run multiplies the learning rate by this after every epoch.
LR_DECAY = 0.6
#: The test accuracy whose time-to-reach is measured.
TARGET_ACCURACY = 0.985
#: Images per timed epoch on the CPU (full runs); quick runs use :data:`QUICK_IMAGES`, after
#: :data:`QUICK_WARMUP_BATCHES` warm-up batches instead of five.
CPU_IMAGES = 10_000
QUICK_IMAGES = 512
#: Images per timed epoch on an accelerator (full runs): 156 batches, about a second of the
#: tutorial's DataLoader and a quarter of a second device-resident on an H200.
GPU_IMAGES = 20_000
QUICK_WARMUP_BATCHES = 1
#: Training seconds allowed on the CPU for the time-to-accuracy figure.
CPU_BUDGET_S = 300.0
#: Epochs allowed on an accelerator for the time-to-accuracy figure.
MAX_EPOCHS = 30


def tutorial_loader(n: int | None = None, *, batch_size: int = BATCH_SIZE, seed: int = 0) -> DataLoader:
    """The tutorial's training DataLoader: ``ToTensor()`` per image, shuffled, batch 128,
    ``num_workers=0`` (chapter 5); the first ``n`` training images only when ``n`` is given."""
    ds = mnist(train=True)
    if n is not None:
        ds = Subset(ds, range(min(n, len(ds))))
    return DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=0,
                      generator=torch.Generator().manual_seed(seed))


def _model_and_optimizer(device: torch.device, seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = MnistCNN().to(device)
    # fused=True runs Adam's update as one kernel on CUDA; elsewhere the default implementation.
    fused = True if device.type == "cuda" else None
    return model, torch.optim.Adam(model.parameters(), lr=LR, fused=fused)


def _epoch(model: nn.Module, optimizer: torch.optim.Optimizer, batches, device: torch.device,
           max_batches: int | None = None) -> int:
    """One training pass of the book's epoch (no metric: bare steps); returns images seen."""
    from helpers.training import train_epoch

    return train_epoch(model, batches, optimizer, nn.CrossEntropyLoss(), device,
                       accuracy=False, max_batches=max_batches)["images"]


def train_images_per_s(batches, device: torch.device, *, warmup_batches: int = 5) -> tuple[float, float]:
    """Images per second over one training epoch of chapter 5's CNN on ``device`` fed by
    ``batches``; returns ``(images_per_s, seconds)``. A few warm-up steps come first, so CUDA
    start-up and cuDNN's algorithm choice are not counted."""
    device = torch.device(device)
    model, optimizer = _model_and_optimizer(device)
    _epoch(model, optimizer, batches, device, max_batches=warmup_batches)
    seen: list[int] = []
    seconds = timed(lambda: seen.append(_epoch(model, optimizer, batches, device)), device)
    return seen[0] / seconds, seconds


def _test_accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of the (device-resident) test images classified correctly."""
    from helpers.training import evaluate

    batches = TensorBatches(images, labels, batch_size=2_000)
    return evaluate(model, batches, nn.CrossEntropyLoss(), images.device)["acc"]


def time_to_accuracy(device: torch.device, *, target: float = TARGET_ACCURACY,
                     max_epochs: int = MAX_EPOCHS, budget_s: float | None = None,
                     train_subset: int | None = None, test_subset: int | None = None,
                     seed: int = 0) -> dict[str, float | bool]:
    """Train on the device-resident path until the test accuracy reaches ``target``, checking
    after every epoch; stop early after ``max_epochs`` or once ``budget_s`` training seconds are
    spent. ``train_subset`` / ``test_subset`` keep the first N images (for tests). Returns
    seconds (training only), epochs, accuracy and whether the target was reached."""
    device = torch.device(device)
    x, y = mnist_tensors(True, device, subset=train_subset)
    xt, yt = mnist_tensors(False, device, subset=test_subset)
    gen = torch.Generator().manual_seed(seed)
    batches = TensorBatches(x, y, batch_size=BATCH_SIZE, shuffle=True, generator=gen)
    # CUDA start-up and every kernel's first call are paid before the clock starts, by a few
    # steps of a throw-away model; the timed model starts from its own seeded initialisation.
    spare, spare_optimizer = _model_and_optimizer(device, seed + 1)
    _epoch(spare, spare_optimizer, batches, device, max_batches=5)
    _test_accuracy(spare, xt[:256], yt[:256])
    del spare, spare_optimizer
    model, optimizer = _model_and_optimizer(device, seed)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=LR_DECAY)
    seconds, accuracy, epochs = 0.0, 0.0, 0
    while epochs < max_epochs:
        seconds += timed(lambda: (_epoch(model, optimizer, batches, device), scheduler.step()),
                         device)
        epochs += 1
        accuracy = _test_accuracy(model, xt, yt)
        if accuracy >= target or (budget_s is not None and seconds >= budget_s):
            break
    return {"seconds": seconds, "epochs": epochs, "accuracy": accuracy,
            "reached": accuracy >= target}


def _throughput_figures(device: torch.device, n: int | None, prefix: str, tag: str,
                        warmup_batches: int = 5) -> list[Figure]:
    where = f"{n:,} training images" if n is not None else "the full 60,000-image epoch"
    loader_rate, loader_s = train_images_per_s(tutorial_loader(n), device,
                                               warmup_batches=warmup_batches)
    x, y = mnist_tensors(True, device, subset=n)
    resident = TensorBatches(x, y, batch_size=BATCH_SIZE, shuffle=True,
                             generator=torch.Generator().manual_seed(0))
    resident_rate, resident_s = train_images_per_s(resident, device,
                                                   warmup_batches=warmup_batches)
    dev = str(device)
    return [
        Figure(f"{prefix}tutorial_loader_images_per_s", loader_rate, "images/s", dev, None,
               f"{tag}one training epoch over {where} ({loader_s:.2f} s), DataLoader with "
               f"ToTensor, batch {BATCH_SIZE}, num_workers=0, batches copied to {dev}"),
        Figure(f"{prefix}resident_images_per_s", resident_rate, "images/s", dev, None,
               f"{tag}one training epoch over {where} ({resident_s:.2f} s), images kept on "
               f"{dev} as one tensor, batch {BATCH_SIZE} by indexing"),
        Figure(f"{prefix}resident_over_tutorial_loader", resident_rate / loader_rate, "x", dev, None,
               f"{tag}device-resident images/s divided by the tutorial-style DataLoader's"),
    ]


@workload("mnist", chapter=5)
def run(device: torch.device, *, quick: bool = False) -> list[Figure]:
    """Chapter 5's MNIST CNN: training images/s with the tutorial-style DataLoader and with the
    device-resident dataset, and the training time to reach 98.5% test accuracy."""
    device = torch.device(device)
    tag = "quick run: " if quick else ""
    warmup = {"warmup_batches": QUICK_WARMUP_BATCHES} if quick else {}
    figures = _throughput_figures(torch.device("cpu"), QUICK_IMAGES if quick else CPU_IMAGES,
                                  "cpu_", tag, **warmup)
    if device.type != "cpu":
        figures += _throughput_figures(device, QUICK_IMAGES if quick else GPU_IMAGES, "", tag,
                                       **warmup)
    if quick:
        return figures
    on_cpu = device.type == "cpu"
    result = time_to_accuracy(device, budget_s=CPU_BUDGET_S if on_cpu else None)
    limit = (f"a budget of {CPU_BUDGET_S:.0f} training seconds" if on_cpu
             else f"{MAX_EPOCHS} epochs")
    outcome = (f"reached {result['accuracy']:.4f} after {result['epochs']} epochs"
               if result["reached"] else
               f"NOT reached within {limit}: {result['accuracy']:.4f} after "
               f"{result['epochs']} epochs")
    common = (f"device-resident MNIST, batch {BATCH_SIZE}, Adam lr {LR} times {LR_DECAY} after "
              f"each epoch, test accuracy checked "
              f"after each epoch (not timed); target {TARGET_ACCURACY:.1%}: {outcome}")
    figures += [
        Figure("seconds_to_target", result["seconds"], "s", str(device), None, common),
        Figure("test_accuracy_at_stop", result["accuracy"], "fraction", str(device), None, common),
    ]
    return figures
