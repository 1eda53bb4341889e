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

:func:`compile_or_explain` runs a first compiled call and, where the compiler cannot work on
this machine (no Triton for a CUDA GPU, a GPU too old for Triton, no C++ compiler for the
CPU), prints what is missing and what to do instead of a traceback; chapters 11 and 12 use it.
:func:`cold_compile_cache` gives a block empty compiler caches, so that a first compilation is
timed as on a fresh machine.

:func:`compare` (defined in :mod:`helpers.timing`, importable from here too) puts two timings
side by side and gives a verdict only where their spreads allow one ("no measurable
difference" otherwise); :func:`device_busy` measures how much of a step keeps a CUDA GPU
busy, :func:`bound_by` names what bounds a step from that share (:data:`GPU_BOUND_SHARE`),
:func:`h100_class` says whether a GPU is of the class the book measured (H100, H200), and
:func:`fp32_convolutions_use_tf32` says whether "plain fp32"
convolutions already run on TF32 tensor cores.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from helpers.devices import resolve_device
from helpers.models import MnistCNN
from helpers.timing import (  # defined there; chapter 10 imports them from here
    NO_DIFFERENCE,
    Comparison,
    compare,
)

__all__ = ["BATCH_SIZE", "GPU_BATCH_SIZE", "MODELS", "NO_DIFFERENCE", "RESNET_GPU_SIZE",
           "RESNET_SMALL_SIZE", "ResidualCNN", "resnet_size", "TF32_ADVICE", "Comparison",
           "CompileOutcome", "DeviceBusy", "RecipeStep", "bf16_is_fast", "cold_compile_cache",
           "compare", "compile_advice", "compile_cache_hits", "compile_failures", "compile_or_explain",
           "GPU_BOUND_SHARE", "bound_by", "h100_class", "device_busy", "fp32_convolutions_use_tf32", "make_step", "recipes_for",
           "tf32_advice_ignored"]

#: The book's batch size for the CNN (chapter 5); full GPU runs use :data:`GPU_BATCH_SIZE`.
BATCH_SIZE = 128
GPU_BATCH_SIZE = 512
#: The residual CNN's (width, batch size) on a CUDA GPU, where a step keeps it busy, and
#: elsewhere (a CPU, an Apple GPU, a quick benchmark run), where the full size takes a CPU a
#: fifth of a second per step and bf16 is emulated: see :func:`resnet_size`.
RESNET_GPU_SIZE = (64, 1024)
RESNET_SMALL_SIZE = (16, 16)


def resnet_size(device: torch.device | str, *, quick: bool = False) -> tuple[int, int]:
    """The residual CNN's ``(width, batch size)`` the book measures on ``device`` (chapter 12
    and the benchmark): :data:`RESNET_GPU_SIZE` on a CUDA GPU, :data:`RESNET_SMALL_SIZE`
    elsewhere and in quick runs."""
    return RESNET_GPU_SIZE if _kind(device).type == "cuda" and not quick else RESNET_SMALL_SIZE


class ResidualCNN(nn.Module):
    """A small residual CNN for MNIST's images that keeps a GPU busy (chapter 12).

    A 3x3 convolution 1 -> ``width`` channels; a residual block (two 3x3 convolutions, each
    followed by BatchNorm, the input added back before the last ReLU) at 28x28; a stride-2
    3x3 convolution ``width`` -> 2 ``width`` to 14x14; a residual block there; global average
    pooling and a linear layer to 10 logits. With ``width=64``, about 0.26 GFLOP per image
    forward (five convolutions carry nearly all of it): a step at batch 1024 keeps a big GPU
    busy for milliseconds (bound by the GPU), where on an H100 or H200 the chapter 5 CNN's
    step leaves it waiting for the host's launches (bound by the host: :func:`bound_by`).
    Takes ``[N, 1, 28, 28]`` and returns logits ``[N, 10]``.
    """

    def __init__(self, width: int = 64) -> None:
        width = _whole("width", width, 1)
        super().__init__()

        def conv(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1,
                                           bias=False), nn.BatchNorm2d(c_out))

        self.stem = nn.Sequential(conv(1, width), nn.ReLU())
        self.block1 = nn.Sequential(conv(width, width), nn.ReLU(), conv(width, width))
        self.down = nn.Sequential(conv(width, 2 * width, stride=2), nn.ReLU())
        self.block2 = nn.Sequential(conv(2 * width, 2 * width), nn.ReLU(),
                                    conv(2 * width, 2 * width))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(2 * width, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = torch.relu(x + self.block1(x))
        x = self.down(x)
        x = torch.relu(x + self.block2(x))
        return self.head(x)


#: The models a recipe step trains: the chapter 5 CNN, and the residual CNN.
MODELS: dict[str, Callable[..., nn.Module]] = {"cnn": MnistCNN, "resnet": ResidualCNN}


def _device(device: torch.device | str) -> torch.device:
    """``device`` checked to exist here (``resolve_device``), and able to run a step."""
    device = resolve_device(device)
    if device.type == "meta":
        raise ValueError("the meta device computes nothing, so there is no step to train or "
                         "time on it; pass 'cpu' or a GPU such as 'cuda'")
    return device


def _kind(device: torch.device | str) -> torch.device:
    """``device`` parsed, for the functions that only predict from it (it need not be here)."""
    try:
        parsed = torch.device(device) if not isinstance(device, torch.device) else device
    except (RuntimeError, TypeError):
        parsed = resolve_device(device)  # " cpu " resolves; a misspelt device gets its error
    if parsed.type == "meta":
        raise ValueError("the meta device computes nothing, so there is no step to train or "
                         "time on it; pass 'cpu' or a GPU such as 'cuda'")
    return parsed


def _whole(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{name} must be a whole number of at least {least}, got {value!r}")
    return int(value)


_T = TypeVar("_T")


def _ask_cuda(query: Callable[[torch.device], _T], device: torch.device) -> _T:
    """``query(device)``, a ``torch.cuda`` question about one GPU; where ``device`` is not
    one of this machine's, the error names the devices it has (``resolve_device``)."""
    try:
        return query(device)
    except (RuntimeError, AssertionError, ValueError):
        resolve_device(device)  # names the devices this machine has
        raise


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
    device = _kind(device)
    if device.type == "cuda" and not torch.version.hip:
        return _ask_cuda(torch.cuda.get_device_capability, device) >= (8, 0)
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
    device = _kind(device)
    names = ["plain"] + (["bf16_autocast"] if bf16_is_fast(device) else []) + ["channels_last"]
    if device.type == "cuda":
        names += ["fp16_autocast_gradscaler", "cudnn_benchmark", "plain_host_copy",
                  "pinned_non_blocking", "compile"]
    return names


class RecipeStep:
    """One recipe applied to a fresh, seeded chapter 5 CNN with Adam (chapter 12), or with
    ``model="resnet"`` to a :class:`ResidualCNN` (``width`` channels, 64 unless given).

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
                 seed: int = 0, model: str = "cnn", width: int | None = None) -> None:
        device = _device(device)
        if model not in MODELS:
            raise ValueError(f"model must be one of {sorted(MODELS)}, got {model!r}")
        if width is not None and model != "resnet":
            raise ValueError(f"width sets the residual CNN's channels; {model!r} has none")
        if recipe not in recipes_for(device) and recipe != "compile":
            raise ValueError(f"recipe {recipe!r} does not apply to {device}; "
                             f"choose from {recipes_for(device)}")
        if (isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not math.isfinite(lr)
                or lr <= 0):
            raise ValueError(f"lr must be a positive learning rate such as 1e-3, got {lr!r}")
        seed = _whole("seed", seed, 0)
        self.recipe, self.device = recipe, device
        self.memory_format = (torch.channels_last if recipe == "channels_last"
                              else torch.contiguous_format)
        torch.manual_seed(seed)
        self.model_name = model
        built = MODELS[model](**({} if width is None else {"width": width}))
        self.model = built.to(device).to(memory_format=self.memory_format)
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

    def _check_batch(self, x: object, y: object) -> None:
        # Python-side checks only (no device synchronisation), so timing is unaffected.
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            raise TypeError(f"a step takes two tensors (images, labels), got "
                            f"{type(x).__name__} and {type(y).__name__}")
        if x.dim() != 4 or tuple(x.shape[1:]) != (1, 28, 28):
            raise ValueError(f"images must have shape (batch, 1, 28, 28), got {tuple(x.shape)}; "
                             "add the channel dimension with x.unsqueeze(1)")
        if y.shape != (x.shape[0],) or y.dtype != torch.int64:
            raise ValueError(f"labels must be int64 class indices of shape ({x.shape[0]},), got "
                             f"{y.dtype} of shape {tuple(y.shape)}; use y.long()")
        for name, t in (("images", x), ("labels", y)):
            if t.device.type != self.device.type or (
                    self.device.index is not None and t.device.index != self.device.index):
                raise ValueError(f"the {name} are on {t.device} but the model is on "
                                 f"{self.device}; move them with .to(step.device)")

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self._check_batch(x, y)
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
              seed: int = 0, model: str = "cnn",
              width: int | None = None) -> Callable[[], torch.Tensor]:
    """A function that runs one training step of ``model`` (``"cnn"``, the chapter 5 CNN, or
    ``"resnet"``, :class:`ResidualCNN`) with ``recipe`` applied.

    The model, optimiser and a synthetic batch are created here (seeded, through
    :class:`RecipeStep`), so every recipe starts alike. ``cudnn_benchmark`` sets
    ``torch.backends.cudnn.benchmark`` while its step runs and restores the previous value
    afterwards. ``plain_host_copy`` and ``pinned_non_blocking`` also copy the batch from host
    memory in every step.
    """
    batch_size = _whole("batch_size", batch_size, 1)
    train_step = RecipeStep(recipe, device, seed=seed, model=model, width=width)
    device = train_step.device
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


# -- torch.compile where its compiler may be missing -------------------------------------------


@functools.cache
def compile_failures() -> tuple[type[BaseException], ...]:
    """The exceptions ``torch.compile``'s first call raises when its compiler cannot work on
    this machine (chapter 12): read from ``torch._dynamo.exc`` and ``torch._inductor.exc`` on
    first use, because importing inductor takes seconds."""
    from torch._dynamo import exc as dynamo_exc
    from torch._inductor import exc as inductor_exc

    # TritonMissing and GPUTooOldForTriton derive from ShortenTraceback, not from
    # BackendCompilerFailed: dynamo re-raises them unwrapped. InductorError (a
    # BackendCompilerFailed) wraps a missing or failing C++ compiler. getattr: a class that an
    # older torch lacks is left out rather than failing the import.
    found = [getattr(inductor_exc, name, None) for name in
             ("TritonMissing", "GPUTooOldForTriton", "InvalidCxxCompiler", "CppCompileError")]
    return (dynamo_exc.BackendCompilerFailed, *(c for c in found if c is not None))


def compile_advice(exc: BaseException, device: torch.device | str) -> str:
    """What a failed first ``torch.compile`` call on ``device`` needs, in words (chapter 12).

    ``exc`` is one of :func:`compile_failures`; a ``BackendCompilerFailed`` is read through to
    the exception it wraps (``inner_exception``).
    """
    failures = compile_failures()
    if not isinstance(exc, failures):
        raise TypeError(f"compile_advice explains torch.compile's compiler failures "
                        f"({', '.join(t.__name__ for t in failures)}), "
                        f"not {type(exc).__name__}: {exc}")
    device = resolve_device(device)
    inner = getattr(exc, "inner_exception", None) or exc
    first = str(inner).strip().splitlines()[0][:200] if str(inner).strip() else ""
    names = {type(exc).__name__, type(inner).__name__}
    if "TritonMissing" in names:
        need = ("inductor generates Triton kernels for a GPU, and no working Triton is "
                "installed: pip install triton (PyTorch's CUDA wheels install the matching "
                "version)")
    elif "GPUTooOldForTriton" in names:
        need = ("Triton needs a CUDA GPU of compute capability 7.0 or later; on this GPU run "
                "the model without torch.compile (Colab's T4 is 7.5)")
    elif names & {"InvalidCxxCompiler", "CppCompileError"}:
        need = ("inductor compiles C++ for the CPU and needs a working C++ compiler on the "
                "PATH: install g++ or clang++ (on macOS: xcode-select --install)")
    else:
        need = ("the compiler backend failed; the model still runs without torch.compile, "
                "and TORCHDYNAMO_VERBOSE=1 shows the full traceback")
    return (f"torch.compile could not compile for {device} ({type(inner).__name__}: {first}). "
            f"What to do: {need}.")


@dataclass
class CompileOutcome:
    """What :func:`compile_or_explain` saw: ``ok``, or the error and its advice (chapter 12)."""

    error: BaseException | None = None
    advice: str | None = None

    @property
    def ok(self) -> bool:
        """True when the block ran to its end (the compiler worked)."""
        return self.error is None


@contextlib.contextmanager
def compile_or_explain(device: torch.device | str) -> Iterator[CompileOutcome]:
    """Run a block that calls a ``torch.compile``d function on ``device``; if the compiler
    cannot work here (:func:`compile_failures`), print what to do and go on (chapters 11, 12).

    Any other exception propagates. Use ``outcome.ok`` after the block::

        with compile_or_explain(device) as outcome:
            out = torch.compile(fn)(x)
    """
    device = resolve_device(device)
    outcome = CompileOutcome()
    try:
        yield outcome
    except compile_failures() as exc:
        outcome.error, outcome.advice = exc, compile_advice(exc, device)
        print(outcome.advice)


@contextlib.contextmanager
def cold_compile_cache() -> Iterator[None]:
    """Run the block with empty, temporary compiler caches, as on a fresh machine (chapter 12).

    ``torch.compile`` keeps what it generated on disk (inductor's cache folder,
    ``TORCHINDUCTOR_CACHE_DIR``, and Triton's kernels beside it), so a second run of the same
    model, even in a new process, skips most of its code generation: timed in such a run, a
    first compiled call looks many times cheaper than a reader's first one. Inside this block
    both caches point to a new temporary folder (removed afterwards) and inductor's in-memory
    caches are cleared: torch's own ``fresh_cache`` (torch 2.9 to 2.14). Dynamo's cache of
    code it already compiled in this process is not cleared: compile a model built inside or
    just before the block.
    """
    from torch._inductor.utils import fresh_cache

    with fresh_cache():
        yield


def compile_cache_hits() -> int:
    """How many times this process's compilations have read code from the compiler's cache on
    disk so far (chapters 11 and 12): hits of inductor's FX graph cache and of AOTAutograd's
    cache (torch 2.9 to 2.14 count them in ``torch._dynamo.utils.counters``). They are hits,
    not graphs: one model read back from AOTAutograd's cache also reads its forward and its
    backward graph from inductor's, three hits. Read it before and after a first compiled
    call: no new hit means the call generated its code, as on a fresh machine."""
    from torch._dynamo.utils import counters

    return (counters["inductor"]["fxgraph_cache_hit"]
            + counters["aot_autograd"]["autograd_cache_hit"])


# -- what bounds a step ----------------------------------------------------------------------


def _time_figure(name: str, value: object) -> float:
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{name} must be a positive finite time, got {value!r}")
    return float(value)


def fp32_convolutions_use_tf32(device: torch.device | str) -> bool:
    """Whether a "plain fp32" convolution on ``device`` runs on TF32 tensor cores (chapter 12).

    On CUDA GPUs of compute capability 8.0 (Ampere) and later, cuDNN computes float32
    convolutions in TF32 unless told otherwise: ``torch.backends.cudnn.conv.fp32_precision``
    is ``"tf32"`` by default (torch 2.9 and later; the older flag
    ``torch.backends.cudnn.allow_tf32`` is True by default), while float32 matrix products
    (``nn.Linear``) stay full fp32 (``torch.get_float32_matmul_precision()`` is
    ``"highest"``). GPUs before 8.0 (Colab's T4, 7.5) have no TF32, ROCm builds are left out,
    and other devices answer False.
    """
    device = _kind(device)
    if device.type != "cuda" or torch.version.hip or not torch.backends.cudnn.enabled:
        return False
    capability = _ask_cuda(torch.cuda.get_device_capability, device)
    if tuple(capability) < (8, 0):
        return False
    precision = getattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision", None)
    if precision in ("tf32", "ieee"):
        return precision == "tf32"
    with warnings.catch_warnings():  # the legacy flag; torch 2.9+ may warn that it is old
        warnings.simplefilter("ignore")
        return bool(torch.backends.cudnn.allow_tf32)


#: The share of a step's wall time a GPU must be busy for the step to be *bound by the GPU*
#: (chapter 12). Below it the GPU waits for the host's kernel launches for more than a tenth of
#: the step: the host sets the step's time, and the step is *bound by the host*. The tenth
#: leaves room for the gaps a busy GPU still has (the residual CNN's step on an H200: 0.99).
GPU_BOUND_SHARE = 0.9


def bound_by(share: float) -> str:
    """What bounds a step whose GPU is busy for ``share`` of it (chapter 12): ``"the GPU"``
    from :data:`GPU_BOUND_SHARE` on, ``"the host"`` below it."""
    if (isinstance(share, bool) or not isinstance(share, numbers.Real)
            or not math.isfinite(share) or share < 0):
        raise ValueError(f"share must be a busy share of a step (0 or more), got {share!r}")
    return "the GPU" if share >= GPU_BOUND_SHARE else "the host"


def h100_class(gpu: torch.device | str | Mapping[str, object]) -> bool:
    """Whether ``gpu`` is of the class the book measured chapter 12 on: a CUDA GPU of compute
    capability 9.0 or later with 100 SMs or more (H100, H200, and the faster GPUs after them),
    where the chapter 5 CNN's step is bound by the host (chapter 12).

    ``gpu`` is a CUDA device of this machine, or a GPU of a committed result file's machine
    record (its ``capability``, such as ``"9.0"``, and ``multiprocessors``). Smaller GPUs of
    capability 9.0 (the H20, 78 SMs) are left out, as are ROCm builds and every other device.
    A record does not say whether it is a ROCm GPU: read its machine's ``accelerator`` first.
    """
    if isinstance(gpu, Mapping):
        try:
            capability = tuple(int(p) for p in str(gpu["capability"]).split(".")[:2])
            sms = int(gpu["multiprocessors"])  # type: ignore[call-overload]
        except (KeyError, TypeError, ValueError):
            raise ValueError("a committed GPU record needs its 'capability' (such as '9.0') "
                             f"and 'multiprocessors', got {dict(gpu)!r}") from None
        return capability >= (9, 0) and sms >= 100
    device = _kind(gpu)
    if device.type != "cuda" or torch.version.hip:
        return False
    props = _ask_cuda(torch.cuda.get_device_properties, device)
    return (props.major, props.minor) >= (9, 0) and props.multi_processor_count >= 100


@dataclass(frozen=True)
class DeviceBusy:
    """What :func:`device_busy` measured (chapter 12): per step, the GPU's busy milliseconds
    (kernels and copies, overlaps counted once) and how many kernels and copies ran."""

    steps: int
    busy_ms: float
    operations: float

    def share(self, step_ms: float) -> float:
        """The share of a step of ``step_ms`` milliseconds (its wall time) the GPU was busy."""
        step_ms = _time_figure("step_ms", step_ms)
        return self.busy_ms / step_ms


class NoGpuWorkProfiled(RuntimeError):
    """A profile of training steps on a CUDA GPU that holds none of the GPU's work
    (:func:`device_busy`, chapter 12): the profiler could not record the GPU."""


def _busy_from_events(events: object, steps: int, index: int) -> DeviceBusy:
    """Busy time and operation count per step from a profile's events (CUDA device ``index``):
    every kernel, copy and fill the GPU ran, user annotations (labels) left out."""
    from torch.autograd import DeviceType

    spans = sorted((e.time_range.start, e.time_range.end) for e in events  # type: ignore[attr-defined]
                   if e.device_type == DeviceType.CUDA and not e.is_user_annotation
                   and e.device_index == index)
    if not spans:  # every training step runs kernels: the profiler did not see them
        raise NoGpuWorkProfiled(
            f"the profiler recorded no GPU work on cuda:{index} in {steps} step(s): CUPTI, "
            "the library it records the GPU with, is missing or failed to load. helpers hides "
            "the profiler's own messages (KINETO_LOG_LEVEL=6): set KINETO_LOG_LEVEL=0 before "
            "importing helpers to read what it says")
    busy, end = 0.0, -math.inf
    for start, stop in spans:  # the union of the spans: overlapping work counts once
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return DeviceBusy(steps=steps, busy_ms=busy / 1e3 / steps, operations=len(spans) / steps)


def device_busy(fn: Callable[[], object], device: torch.device | str, *,
                steps: int = 10) -> DeviceBusy:
    """How long a CUDA GPU is busy per call of ``fn`` (one training step), from the profiler
    (chapter 12).

    One call runs first (first-call costs stay out), then ``steps`` calls under
    ``torch.profiler``; the GPU's kernels and copies on ``device`` are added up, overlaps
    counted once. Compare with the step's wall time (``DeviceBusy.share``): a step whose GPU is
    busy for less than :data:`GPU_BOUND_SHARE` of it is bound by the host, which launches the
    kernels (:func:`bound_by`).
    """
    if not callable(fn):
        raise TypeError(f"device_busy needs the step to call, got {fn!r}")
    steps = _whole("steps", steps, 1)
    device = _device(device)
    if device.type != "cuda":
        raise ValueError(f"device_busy measures a CUDA GPU's kernels, got {device}")
    from torch.profiler import ProfilerActivity, profile

    from helpers.timing import synchronize

    index = device.index if device.index is not None else torch.cuda.current_device()
    fn()
    synchronize(device)
    # acc_events=True: one profiling cycle either way. Without it, torch 2.10 and 2.11 warn
    # once per process, on the first profile opened ("Profiler clears events at the end of
    # each cycle"); 2.14.1 once too, but only at a profile's second cycle; 2.9 never.
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 acc_events=True) as prof:
        for _ in range(steps):
            fn()
        synchronize(device)
    return _busy_from_events(prof.events(), steps, index)
