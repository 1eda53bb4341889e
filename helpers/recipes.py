"""Performance recipes for one training step of the chapter 5 CNN (chapter 12).

Chapter 12 (Performance recipes) applies each recipe to the chapter 5 CNN
(:class:`helpers.models.MnistCNN`, Adam, cross-entropy) and measures it against the plain
fp32 step in the same run. :class:`RecipeStep` is one recipe's training step and
:func:`make_step` a ready-to-time step on a synthetic batch of MNIST's shape (the step's speed
does not depend on the pixel values); the book's benchmark (``bench/recipes.py``) times the
same steps.

Recipes: ``plain``; ``bf16_autocast`` (left out on CUDA GPUs below compute capability 8.0,
see :func:`bf16_is_fast`); ``channels_last``; on CUDA also ``fp16_autocast_gradscaler``,
``cudnn_benchmark``, ``plain_host_copy`` and ``pinned_non_blocking`` (each step also copies
its batch from host memory, pageable, or pinned and ``non_blocking``) and ``compile``
(``torch.compile`` of the model's forward pass, and through AOTAutograd its backward; the loss
and the optimizer stay eager).
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable, Iterator

import torch
from torch import nn

from helpers.models import MnistCNN

__all__ = ["BATCH_SIZE", "GPU_BATCH_SIZE", "TF32_ADVICE", "RecipeStep", "bf16_is_fast",
           "make_step", "recipes_for", "tf32_advice_ignored"]

#: The book's batch size for the CNN (chapter 5); full GPU runs use :data:`GPU_BATCH_SIZE`.
BATCH_SIZE = 128
GPU_BATCH_SIZE = 512


def bf16_is_fast(device: torch.device) -> bool:
    """Whether bf16 autocast is worth measuring on ``device`` (chapter 12).

    CUDA GPUs before compute capability 8.0 (Ampere), such as Colab's T4 (7.5), have no bf16
    tensor cores. ``torch.cuda.is_bf16_supported()`` still answers True there, because by
    default it counts emulation (``including_emulation=True``) and asks the *current* GPU;
    bf16 convolutions then take a slow fallback path. This asks ``device`` itself. On ROCm
    builds every GPU answers True (their capability numbers are not CUDA's); the chapter
    measures the recipe there rather than predicting it. On ``mps``, bf16 autocast needs
    macOS 14 or later (older systems warn and turn autocast off). Other devices (the CPU
    included) answer True: the measurement says whether bf16 pays off.
    """
    device = torch.device(device)
    if device.type == "cuda" and not torch.version.hip:
        return torch.cuda.get_device_capability(device) >= (8, 0)
    if device.type == "mps":
        return torch.backends.mps.is_macos_or_newer(14, 0)
    return True


#: Advice that inductor gives while it compiles a float32 matrix product for CUDA: "use TF32"
#: on GPUs of compute capability 8.0 or later (a UserWarning in torch 2.9 and the releases
#: after it; torch 2.14 only logs it), and, on torch 2.9, the deprecation warning of the
#: legacy ``allow_tf32`` flag that the same check reads first (on every CUDA GPU, a T4 too).
TF32_ADVICE = ("TensorFloat32 tensor cores for float32 matrix multiplication",
               "Please use the new API settings to control TF32 behavior")


@contextlib.contextmanager
def tf32_advice_ignored() -> Iterator[None]:
    """Ignore inductor's TF32 advice (:data:`TF32_ADVICE`) inside the block, and no other
    warning (chapter 12).

    The recipes compare float32 steps with float32 steps: the plain step's matrix products do
    not use TF32 either, so the advice is left unfollowed on purpose, and the book shows no
    warnings. Inductor gives it once per process, while it compiles.
    """
    with warnings.catch_warnings():
        for message in TF32_ADVICE:
            warnings.filterwarnings("ignore", message=re.escape(message), category=UserWarning)
        yield


def recipes_for(device: torch.device) -> list[str]:
    """The recipes measured on ``device``, ``plain`` first (chapter 12)."""
    device = torch.device(device)
    names = ["plain"] + (["bf16_autocast"] if bf16_is_fast(device) else []) + ["channels_last"]
    if device.type == "cuda":
        names += ["fp16_autocast_gradscaler", "cudnn_benchmark", "plain_host_copy",
                  "pinned_non_blocking", "compile"]
    return names


class RecipeStep:
    """One recipe applied to a fresh, seeded chapter 5 CNN with Adam (chapter 12).

    Calling it with a batch ``(x, y)`` runs one training step: ``zero_grad``, the forward pass
    and the loss (under autocast for the mixed-precision recipes), ``backward`` (through a
    ``GradScaler`` for fp16) and the optimizer step. ``model`` is the eager module that owns
    the parameters (evaluate and save it); ``net`` is what the forward pass calls: ``model``
    itself, or ``torch.compile(model)`` for the ``compile`` recipe, which compiles the model's
    forward pass and, through AOTAutograd, its backward; the loss, ``zero_grad`` and the
    optimizer step stay eager. :meth:`prepare` puts a batch of images in the recipe's memory
    layout.
    """

    def __init__(self, recipe: str, device: torch.device, *, lr: float = 1e-3,
                 seed: int = 0) -> None:
        device = torch.device(device)
        if recipe not in recipes_for(device) and recipe != "compile":
            raise ValueError(f"recipe {recipe!r} does not apply to {device}; "
                             f"choose from {recipes_for(device)}")
        self.recipe, self.device = recipe, device
        self.memory_format = (torch.channels_last if recipe == "channels_last"
                              else torch.contiguous_format)
        torch.manual_seed(seed)
        self.model = MnistCNN().to(device).to(memory_format=self.memory_format)
        self.net = torch.compile(self.model) if recipe == "compile" else self.model
        self.opt = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.loss_fn = nn.CrossEntropyLoss()
        self.amp_dtype = {"bf16_autocast": torch.bfloat16,
                          "fp16_autocast_gradscaler": torch.float16}.get(recipe)
        # GradScaler keeps its scale on the device of the first loss it scales: ``device``.
        self.scaler = (torch.amp.GradScaler(device.type)
                       if recipe == "fp16_autocast_gradscaler" else None)

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` in the recipe's memory layout (a no-op unless ``channels_last``)."""
        return x.contiguous(memory_format=self.memory_format)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        previous = torch.backends.cudnn.benchmark
        if self.recipe == "cudnn_benchmark":
            torch.backends.cudnn.benchmark = True
        try:
            self.opt.zero_grad(set_to_none=True)
            autocast = (torch.autocast(self.device.type, dtype=self.amp_dtype)
                        if self.amp_dtype is not None else contextlib.nullcontext())
            with autocast:
                loss = self.loss_fn(self.net(x), y)
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
                self.scaler.step(self.opt)  # skips the step if a gradient is inf or NaN
                self.scaler.update()
            else:
                loss.backward()
                self.opt.step()
        finally:
            torch.backends.cudnn.benchmark = previous
        return loss.detach()


def make_step(recipe: str, device: torch.device, batch_size: int = BATCH_SIZE,
              seed: int = 0) -> Callable[[], torch.Tensor]:
    """A function that runs one training step of the chapter 5 CNN with ``recipe`` applied.

    The model, optimiser and a synthetic batch are created here (seeded, through
    :class:`RecipeStep`), so every recipe starts alike. ``cudnn_benchmark`` sets
    ``torch.backends.cudnn.benchmark`` while its step runs and restores the previous value
    afterwards. ``plain_host_copy`` and ``pinned_non_blocking`` also copy the batch from host
    memory in every step.
    """
    device = torch.device(device)
    train_step = RecipeStep(recipe, device, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    host_x = torch.rand(batch_size, 1, 28, 28, generator=gen)
    host_y = torch.randint(0, 10, (batch_size,), generator=gen)
    x, y = train_step.prepare(host_x.to(device)), host_y.to(device)
    if recipe == "pinned_non_blocking":
        host_x, host_y = host_x.pin_memory(), host_y.pin_memory()
    copy = recipe in ("plain_host_copy", "pinned_non_blocking")
    non_blocking = recipe == "pinned_non_blocking"

    def step() -> torch.Tensor:
        if copy:
            return train_step(host_x.to(device, non_blocking=non_blocking),
                              host_y.to(device, non_blocking=non_blocking))
        return train_step(x, y)

    step.recipe_step = train_step  # type: ignore[attr-defined]
    return step
