"""MNIST at GPU speed: the pieces chapter 14 (Training at GPU speed) builds, one step at a time.

Chapter 5 trains the tutorial's CNN from a DataLoader; chapter 14 takes that loop to the fastest
honest training a reader can run. The pieces, each introduced there:

- :class:`DeviceLoader`: the whole split kept on the device, shuffled there (a permutation drawn
  by a generator on the device each epoch), cut into equal batches of indices;
- :class:`FastNet`: a small convolutional net with batch normalisation that reaches 99% test
  accuracy in a couple of epochs (chapter 5's ``MnistCNN``, with its global max-pool head,
  stops near 98.7-98.9%);
- :func:`one_cycle`: the learning rate, rising linearly for the first part of training, then
  falling linearly to zero;
- :func:`make_optimizer`: Adam, fused where the device has the fused kernel, with its learning
  rate held in a tensor on the device when the step is captured;
- :func:`capture_step`: the whole training step (forward, backward, optimizer) recorded once as
  a CUDA graph and replayed; warm-up and capture leave the model and the optimizer as they
  found them;
- :data:`STEPS` and :func:`train`: the chapter's recipes, each trained and timed the same way
  (device synchronised around the timed training; a throw-away warm-up and the capture timed
  apart; evaluation on the device, after the clock stops, by :func:`device_accuracy`).
"""

from __future__ import annotations

import contextlib
import math
import timeit
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["FP16_LOSS_SCALE", "STEPS", "CudaGraphs", "DeviceLoader", "FastNet", "Recipe",
           "TrainRun", "busy_share", "capture_step", "fused_supported", "make_optimizer", "one_cycle",
           "precision_dtype", "device_accuracy", "set_lr", "train"]

#: The fixed loss scale of the fp16 step (a GPU without fast bf16, such as a T4): the loss is
#: multiplied by it before ``backward`` so small gradients survive in fp16, and the gradients
#: divided by it before the optimizer step. Fixed, not a GradScaler, so the captured step needs
#: no check on the host.
FP16_LOSS_SCALE = 1024.0


class FastNet(nn.Sequential):
    """Three blocks of convolution (3x3), batch norm, ReLU and 2x2 max-pool (1 -> 32 -> 64 ->
    128 channels, 28 -> 14 -> 7 -> 3 pixels), then one linear layer to 10 logits (chapter 14).
    """

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128)) -> None:
        if not widths or any(isinstance(w, bool) or not isinstance(w, int) or w < 1
                             for w in widths):
            raise ValueError(f"widths must be positive whole numbers of channels, got {widths!r}")
        layers: list[nn.Module] = []
        channels, size = 1, 28
        for width in widths:
            layers += [nn.Conv2d(channels, width, 3, padding=1, bias=False),
                       nn.BatchNorm2d(width), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            channels, size = width, size // 2
        super().__init__(*layers, nn.Flatten(), nn.Linear(channels * size * size, 10))


class DeviceLoader:
    """Batches of a device-resident dataset, shuffled on its device (chapter 14).

    Each epoch draws a permutation with a generator on the data's device (seeded by ``seed``),
    so no index crosses the bus, and cuts it into ``len(self)`` batches of exactly
    ``batch_size`` (the last, partial batch is dropped: a captured step has fixed shapes).
    Iterating yields ``(images, labels)``; :meth:`index_batches` yields the index tensors.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, *,
                 seed: int = 0) -> None:
        if not (isinstance(images, torch.Tensor) and isinstance(labels, torch.Tensor)):
            raise TypeError("DeviceLoader takes two tensors, the images and the labels")
        if len(images) != len(labels) or images.device != labels.device:
            raise ValueError(f"images and labels must have one length and one device, got "
                             f"{len(images)} on {images.device} and {len(labels)} on "
                             f"{labels.device}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) \
                or not 1 <= batch_size <= len(images):
            raise ValueError(f"batch_size must be a whole number from 1 to the {len(images)} "
                             f"examples, got {batch_size!r}")
        self.images, self.labels, self.batch_size = images, labels, batch_size
        self.generator = torch.Generator(device=images.device).manual_seed(seed)

    def __len__(self) -> int:
        return len(self.images) // self.batch_size

    def index_batches(self) -> Iterator[torch.Tensor]:
        """One epoch of index batches, each ``batch_size`` long, on the data's device."""
        order = torch.randperm(len(self.images), device=self.images.device,
                               generator=self.generator)
        for i in range(len(self)):
            yield order[i * self.batch_size:(i + 1) * self.batch_size]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for idx in self.index_batches():
            yield self.images[idx], self.labels[idx]


def one_cycle(step: int, total: int, peak: float, *, warmup: float = 0.25) -> float:
    """The learning rate at ``step`` (0-based) of ``total`` (chapter 14): a linear rise from
    ``peak / 10`` to ``peak`` over the first ``warmup`` share of the steps, then a linear fall
    that reaches zero after the last step."""
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise ValueError(f"total must be a positive whole number of steps, got {total!r}")
    if not 0 <= step < total:
        raise ValueError(f"step must be in [0, {total}), got {step!r}")
    if not (math.isfinite(peak) and peak > 0) or not 0 <= warmup < 1:
        raise ValueError(f"peak must be > 0 and warmup in [0, 1), got {peak!r}, {warmup!r}")
    rise = int(total * warmup)
    if step < rise:
        return peak * (0.1 + 0.9 * step / rise)
    return peak * (total - step) / (total - rise)


def fused_supported(device: torch.device | str) -> bool:
    """Whether Adam has a fused kernel (``fused=True``) on ``device``'s type (chapter 14): CUDA
    and the CPU in every torch the book supports (2.9 and later)."""
    return torch.device(device).type in ("cuda", "cpu")


def make_optimizer(model: nn.Module, lr: float, *, fused: bool = False,
                   captured: bool = False) -> torch.optim.Adam:
    """Adam over ``model``'s parameters (chapter 14). ``fused`` asks for the one-kernel update
    where :func:`fused_supported`; ``captured`` (CUDA only) makes the step capturable and holds
    the learning rate in a one-element tensor on the device, so a replayed graph reads the
    value :func:`set_lr` writes there."""
    device = next(model.parameters()).device
    kwargs: dict = {}
    if fused and fused_supported(device):
        kwargs["fused"] = True
    if captured:
        if device.type != "cuda":
            raise ValueError(f"only a CUDA step is captured, the model is on {device}")
        kwargs["capturable"] = True
        lr = torch.tensor(float(lr), device=device)
    return torch.optim.Adam(model.parameters(), lr=lr, **kwargs)


def set_lr(optimizer: torch.optim.Optimizer, value: float) -> None:
    """Set every group's learning rate (chapter 14): in place where it is a tensor (a captured
    step reads it), else by assignment."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(value)
        else:
            group["lr"] = value


def precision_dtype(device: torch.device | str) -> torch.dtype | None:
    """The autocast dtype of chapter 14's last step on a CUDA GPU: bf16 where it is fast
    (compute capability 8.0 and later), fp16 on an older one (a T4), with the fixed
    :data:`FP16_LOSS_SCALE`; None (no autocast) elsewhere: the CPU's short version keeps fp32
    (bf16 is slow on CPUs without bf16 instructions, and speed is not what it shows)."""
    from .recipes import bf16_is_fast

    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if bf16_is_fast(device) else torch.float16
    return None


class CudaGraphs:
    """Warm-up on a side stream and capture into a CUDA graph on ``device`` (chapter 14; torch's
    recipe for whole-network capture); :func:`capture_step`'s default backend. Tests pass a
    fake."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def warm_up(self, fn: Callable[[], object], times: int) -> None:
        with torch.cuda.device(self.device):
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(times):
                    fn()
            torch.cuda.current_stream(self.device).wait_stream(side)

    def capture(self, fn: Callable[[], object]) -> Callable[[], None]:
        with torch.cuda.device(self.device):
            graph = torch.cuda.CUDAGraph()
            # the capture stream named on this device: torch.cuda.graph's own default stream
            # is made once per process, on whichever GPU was current at the first capture
            with torch.cuda.graph(graph, stream=torch.cuda.Stream(self.device)):
                fn()
        return graph.replay


def capture_step(body: Callable[[], object], model: nn.Module,
                 optimizer: torch.optim.Optimizer, *, warmup: int = 3,
                 backend: CudaGraphs | None = None) -> Callable[[], None]:
    """Record ``body`` (forward, backward and optimizer step, reading its batch from fixed
    tensors) as a CUDA graph; return the replay (chapter 14).

    ``warmup`` eager calls run first on a side stream (they make the optimizer's state and
    cuDNN's choices); the gradients are set to None so that the captured backward writes them
    afresh at every replay. The warm-up trains, so afterwards the model's parameters and
    buffers are copied back in place and the optimizer's state tensors zeroed (Adam's fresh
    state): the first replay is the first training step.
    """
    tensors = [*model.parameters(), *model.buffers()]
    saved = [t.detach().clone() for t in tensors]
    graphs = backend or CudaGraphs(next(model.parameters()).device)

    def eager() -> None:
        optimizer.zero_grad(set_to_none=True)
        body()

    graphs.warm_up(eager, warmup)
    optimizer.zero_grad(set_to_none=True)
    replay = graphs.capture(body)
    with torch.no_grad():
        for tensor, value in zip(tensors, saved, strict=True):
            tensor.copy_(value)
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    value.zero_()
    return replay


@dataclass(frozen=True)
class Recipe:
    """One step of chapter 14: where the batches come from, the model, batch size, epochs,
    learning rate (constant, or :func:`one_cycle` peaking there) and the step's options."""

    name: str
    key: str  # the step's name in the benchmark's figures
    loader: str = "device"  # "dataloader": the tutorial's, or "device": DeviceLoader
    model: str = "cnn"  # "cnn": chapter 5's MnistCNN, or "fastnet": FastNet
    batch_size: int = 128
    epochs: int = 1
    lr: float = 5e-3
    schedule: bool = False
    fused: bool = False
    captured: bool = False
    precision: bool = False  # autocast to precision_dtype(device)
    channels_last: bool = False


_TUTORIAL = Recipe("tutorial DataLoader", "tutorial", loader="dataloader")
_SCHEDULED = replace(_TUTORIAL, name="batch 512, one-cycle", key="one_cycle", loader="device",
                     batch_size=512, epochs=2, lr=1e-2, schedule=True)
_BN = replace(_SCHEDULED, name="BN conv net", key="bn_net", model="fastnet")
_FUSED = replace(_BN, name="fused Adam", key="fused", fused=True)
_CAPTURED = replace(_FUSED, name="CUDA graph", key="graph", captured=True)
#: The chapter's steps, in order: each changes one thing from the one before.
STEPS: tuple[Recipe, ...] = (
    _TUTORIAL,
    replace(_TUTORIAL, name="data on the device", key="device_data", loader="device"),
    _SCHEDULED, _BN, _FUSED, _CAPTURED,
    replace(_CAPTURED, name="bf16/fp16, channels_last", key="precision", precision=True,
            channels_last=True),
)


@dataclass(frozen=True)
class TrainRun:
    """What :func:`train` measured (chapter 14): images trained, training seconds
    (synchronised), the seconds spent before them on warm-up and capture, and the test accuracy
    afterwards."""

    recipe: Recipe
    images: int
    seconds: float
    prepare_s: float
    accuracy: float
    captured: bool
    #: images/s of each of the ``chunks`` equal parts of the training (empty for one part)
    chunk_rates: tuple[float, ...] = ()
    #: the trained model (left out of comparisons and the repr)
    model: nn.Module | None = field(default=None, repr=False, compare=False)

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds


def _build(recipe: Recipe, device: torch.device) -> tuple[nn.Module, torch.optim.Adam]:
    from .models import MnistCNN

    model = (FastNet() if recipe.model == "fastnet" else MnistCNN()).to(device)
    if recipe.channels_last:
        model = model.to(memory_format=torch.channels_last)
    capturable = recipe.captured and device.type == "cuda"
    return model, make_optimizer(model, recipe.lr, fused=recipe.fused, captured=capturable)


def _step_body(model: nn.Module, optimizer: torch.optim.Optimizer,
               dtype: torch.dtype | None) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """Forward, backward and optimizer step on one batch (gradients already None or zero)."""
    device_type = next(model.parameters()).device.type
    scale = FP16_LOSS_SCALE if dtype == torch.float16 else 1.0
    params = [p for p in model.parameters() if p.requires_grad]

    def body(x: torch.Tensor, y: torch.Tensor) -> None:
        # cache_enabled=False: the weights' casts are redone inside every (captured) step
        with torch.autocast(device_type, dtype=dtype or torch.float32,
                            enabled=dtype is not None, cache_enabled=False):
            loss = F.cross_entropy(model(x), y)
        if scale != 1.0:
            (loss * scale).backward()
            torch._foreach_mul_([p.grad for p in params], 1.0 / scale)
        else:
            loss.backward()
        optimizer.step()

    return body


def device_accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, *,
                  batch_size: int = 2_000) -> float:
    """Share of ``images`` that ``model`` classifies as ``labels`` (chapter 14), computed on
    their device in evaluation mode (one number read back at the end); the model is left in
    training mode."""
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=images.device)
    with torch.no_grad():
        for i in range(0, len(images), batch_size):
            logits = model(images[i:i + batch_size])
            correct += (logits.argmax(1) == labels[i:i + batch_size]).sum()
    model.train()
    return correct.item() / len(images)


def _synchronize(device: torch.device) -> None:
    from .timing import synchronize

    synchronize(device)


def train(recipe: Recipe, device: torch.device | str,
          train_data: tuple[torch.Tensor, torch.Tensor],
          test_data: tuple[torch.Tensor, torch.Tensor], *, seed: int = 0,
          loader: object = None, warmup_steps: int = 3,
          graphs: CudaGraphs | None = None, chunks: int = 1) -> TrainRun:
    """Train ``recipe`` on ``device`` and measure it (chapter 14).

    ``train_data`` / ``test_data``: ``(images, labels)`` on ``device`` (``mnist_tensors``).
    The tutorial's recipe takes its batches from ``loader`` (a DataLoader of CPU tensors),
    copied to the device at every step. First a throw-away model of the same recipe runs
    ``warmup_steps`` steps (CUDA start-up, cuDNN's choices) and a captured recipe warms up and
    captures its step: together ``prepare_s``. Then the clock runs, the device synchronised
    before and after, over ``recipe.epochs`` epochs; the test accuracy is computed after it
    stops. A captured recipe on a device other than CUDA runs its step eagerly
    (``TrainRun.captured`` is False) unless ``graphs`` (a fake of :class:`CudaGraphs`, for
    tests) is given. ``chunks`` > 1 also times that many equal parts of the training (the
    device synchronised at each boundary): ``TrainRun.chunk_rates``, a spread for the rate.
    """
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"chunks must be a whole number >= 1, got {chunks!r}")
    device = torch.device(device)
    images, labels = train_data
    dtype = precision_dtype(device) if recipe.precision else None
    captured = recipe.captured and (device.type == "cuda" or graphs is not None)
    if recipe.loader == "dataloader" and loader is None:
        raise ValueError("the tutorial's recipe needs its DataLoader: pass loader=")
    context = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with context:
        start = timeit.default_timer()
        torch.manual_seed(seed + 10_000)
        spare, spare_opt = _build(replace(recipe, captured=False), device)
        spare_body = _step_body(spare, spare_opt, dtype)
        for _ in range(warmup_steps):
            idx = torch.randint(len(images), (recipe.batch_size,), device=device)
            spare_opt.zero_grad(set_to_none=True)
            spare_body(images[idx], labels[idx])
        del spare, spare_opt, spare_body
        torch.manual_seed(seed)
        model, optimizer = _build(recipe, device)
        body = _step_body(model, optimizer, dtype)
        batches = (DeviceLoader(images, labels, recipe.batch_size, seed=seed)
                   if recipe.loader == "device" else None)
        total = recipe.epochs * (len(batches) if batches is not None else len(loader))
        replay = None
        if captured:
            static_idx = torch.zeros(recipe.batch_size, dtype=torch.long, device=device)
            replay = capture_step(lambda: body(images[static_idx], labels[static_idx]),
                                  model, optimizer, backend=graphs)
        _synchronize(device)
        prepare_s = timeit.default_timer() - start

        ends = {round(total * (k + 1) / chunks) for k in range(chunks)}
        marks: list[tuple[float, int]] = []

        def run() -> int:
            seen, step = 0, 0
            for _ in range(recipe.epochs):
                source = batches.index_batches() if batches is not None else loader
                for batch in source:
                    if recipe.schedule:
                        set_lr(optimizer, one_cycle(step, total, recipe.lr))
                    if replay is not None:
                        static_idx.copy_(batch)
                        replay()
                    else:
                        optimizer.zero_grad(set_to_none=True)
                        if batches is not None:
                            x, y = images[batch], labels[batch]
                        else:
                            x, y = (t.to(device, non_blocking=True) for t in batch)
                        body(x, y)
                    seen += len(batch) if batches is not None else len(batch[0])
                    step += 1
                    if chunks > 1 and step in ends:
                        _synchronize(device)
                        marks.append((timeit.default_timer(), seen))
            return seen

        _synchronize(device)
        t0 = timeit.default_timer()
        seen = run()
        _synchronize(device)
        seconds = timeit.default_timer() - t0
    times = [t0, *(t for t, _ in marks)]
    counts = [0, *(n for _, n in marks)]
    chunk_rates = tuple((counts[i + 1] - counts[i]) / (times[i + 1] - times[i])
                        for i in range(len(marks)))
    accuracy = device_accuracy(model, *test_data)
    return TrainRun(recipe, seen, seconds, prepare_s, accuracy, captured, chunk_rates, model)


def busy_share(recipe: Recipe, device: torch.device | str,
               train_data: tuple[torch.Tensor, torch.Tensor], *,
               steps: int = 20) -> tuple[float, float]:
    """``(busy_ms, step_ms)`` of one training step of ``recipe`` on a CUDA ``device``: the
    milliseconds its GPU is busy per step (:func:`helpers.recipes.device_busy`) and the step's
    wall time, over ``steps`` steps on one device-resident batch (chapter 14's diagnostic)."""
    from .recipes import device_busy
    from .timing import timed

    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"busy_share measures a CUDA GPU's kernels, got {device}")
    images, labels = train_data
    dtype = precision_dtype(device) if recipe.precision else None
    with torch.cuda.device(device):
        model, optimizer = _build(recipe, device)
        body = _step_body(model, optimizer, dtype)
        idx = torch.randint(len(images), (recipe.batch_size,), device=device)

        def eager() -> None:
            optimizer.zero_grad(set_to_none=True)
            body(images[idx], labels[idx])

        step = (capture_step(lambda: body(images[idx], labels[idx]), model, optimizer)
                if recipe.captured else eager)
        for _ in range(3):
            step()
        wall = timed(lambda: [step() for _ in range(steps)], device) / steps
        busy = device_busy(step, device, steps=steps)
    return busy.busy_ms, wall * 1e3
