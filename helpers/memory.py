"""Where training memory goes, predicted without a GPU and measured with one (chapter 13).

Chapter 13 (GPU memory) builds a model on PyTorch's ``meta`` device, where tensors have
shapes, dtypes and sizes but no data, and replays one training step there. Every operation
torch runs is watched, so the prediction comes from torch itself, not from a formula:

- weights, gradients and optimizer state are the storages torch creates for them (the
  optimizer's own ``step()`` runs on meta tensors and makes its state);
- the activations saved for the backward pass are what
  :func:`torch.autograd.graph.saved_tensors_hooks` hands over, each storage counted once
  (views and parameters saved as inputs add nothing);
- the **predicted peak** is the largest total of the storages alive on the device at any
  moment of one repeating training step (``zero_grad``, forward, backward, ``step``), each
  rounded up to ``round_to`` bytes (512: the CUDA caching allocator's smallest block).

:func:`measure_step_peak` measures the same step on a real device: on a CUDA GPU with
``torch.cuda.max_memory_allocated(device)``, on the CPU from the allocations the profiler
records. What no replay can see, the workspace a library takes from the allocator inside
one operation (cuDNN's convolutions on a GPU, oneDNN's scratchpad on a CPU), is measured per
operation on the device by :func:`measure_training_memory` and added to the prediction at its
moment (:meth:`MeasuredStep.with_prediction`). :func:`predict_autocast_saved` predicts what a
forward pass saves under autocast from torch's CUDA or CPU op lists.
:func:`read_oom_message` splits a CUDA out-of-memory message into its figures.
"""

from __future__ import annotations

import copy
import functools
import re
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import checkpoint

__all__ = [
    "CUDA_BLOCK",
    "OPTIMIZERS",
    "MeasuredStep",
    "MemoryPrediction",
    "WideMLP",
    "column_sum_staging",
    "make_optimizer",
    "plot_step_memory",
    "measure_step_peak",
    "measurable",
    "measure_training_memory",
    "measure_training_peak",
    "predict_autocast_saved",
    "predict_training_memory",
    "read_oom_message",
    "saved_tensor_bytes",
    "show_figure",
    "training_step",
]

MiB = 2**20

#: The CUDA caching allocator rounds every request up to a multiple of 512 bytes
#: (``kMinBlockSize`` in c10). Requests over 1 MiB may get a whole cached block up to 1 MiB
#: larger: it splits a large block only when more than 1 MiB would remain.
CUDA_BLOCK = 512

#: The optimizers :func:`predict_training_memory` knows by name, with the settings the
#: chapter uses. A function ``params -> Optimizer`` can be passed instead.
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": lambda params, **kw: torch.optim.SGD(params, lr=0.01, **kw),
    "sgd_momentum": lambda params, **kw: torch.optim.SGD(params, lr=0.01, momentum=0.9, **kw),
    "adam": lambda params, **kw: torch.optim.Adam(params, lr=1e-3, **kw),
    "adamw": lambda params, **kw: torch.optim.AdamW(params, lr=1e-3, **kw),
}


class WideMLP(nn.Module):
    """A multilayer perceptron wide enough to fill a GPU (chapter 13).

    ``depth`` blocks of Linear -> LayerNorm -> GELU of ``width`` features, then a linear head
    to ``classes`` logits. Takes ``[N, *]`` inputs (flattened to ``in_features``). With
    ``checkpoint=True`` each block is recomputed in the backward pass instead of keeping its
    activations (:func:`torch.utils.checkpoint.checkpoint`, ``use_reentrant=False``).
    """

    def __init__(self, in_features: int = 784, width: int = 4096, depth: int = 4,
                 classes: int = 10, checkpoint: bool = False) -> None:
        super().__init__()
        if min(in_features, width, depth, classes) < 1:
            raise ValueError("in_features, width, depth and classes must all be at least 1, "
                             f"got {in_features}, {width}, {depth}, {classes}")
        self.checkpoint = checkpoint
        sizes = [in_features] + [width] * depth
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(a, b), nn.LayerNorm(b), nn.GELU())
            for a, b in zip(sizes[:-1], sizes[1:], strict=True))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for block in self.blocks:
            if self.checkpoint and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(x)


def make_optimizer(optimizer: str | Callable[..., torch.optim.Optimizer],
                   params: Iterable[nn.Parameter], *, foreach: bool | None = None
                   ) -> torch.optim.Optimizer:
    """The optimizer named in :data:`OPTIMIZERS` (or built by ``optimizer(params)``) (chapter 13).

    ``foreach`` chooses PyTorch's multi-tensor implementation (the default on CUDA GPUs), which
    needs more temporary memory during ``step()`` than the one-tensor-at-a-time loop.
    """
    if callable(optimizer):
        opt = optimizer(params)
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"optimizer(params) returned {type(opt).__name__}, not a "
                            "torch.optim.Optimizer")
        return opt
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}: use one of {sorted(OPTIMIZERS)} "
                         "or a function params -> torch.optim.Optimizer")
    return OPTIMIZERS[optimizer](params, foreach=foreach)


def training_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                  target: torch.Tensor, loss_fn: Callable[[torch.Tensor, torch.Tensor],
                                                          torch.Tensor], *,
                  accumulate: int = 1, set_to_none: bool = True,
                  phase: Callable[[str], None] | None = None) -> None:
    """One training step as chapter 13 predicts and measures it (chapter 13).

    ``zero_grad(set_to_none=...)``, then ``accumulate`` forward and backward passes (each on all
    of ``x``, a micro-batch) adding into the gradients, then ``opt.step()``. ``phase`` is told
    which part starts, for a memory timeline.
    """
    mark = phase or (lambda name: None)
    mark("zero_grad")
    opt.zero_grad(set_to_none=set_to_none)
    for _ in range(accumulate):
        mark("forward")
        loss = loss_fn(model(x), target)
        if accumulate > 1:
            loss = loss / accumulate
        mark("backward")
        loss.backward()
        del loss
    mark("optimizer step")
    opt.step()
    mark("end")


def _cross_entropy(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.flatten(0, -2), target.flatten())


def _mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, target)


_LOSSES = {"cross_entropy": _cross_entropy, "mse": _mse}


def _target_like(out: torch.Tensor, loss: str) -> torch.Tensor:
    if loss == "cross_entropy":
        return torch.zeros(out.shape[:-1], dtype=torch.long, device=out.device)
    return torch.zeros_like(out)


def _rounded(nbytes: int, round_to: int) -> int:
    return -(-nbytes // round_to) * round_to


class _LiveStorages(TorchDispatchMode):
    """Watches every operation and keeps the total of the storages alive on one device."""

    def __init__(self, device_type: str, round_to: int) -> None:
        super().__init__()
        self.device_type, self.round_to = device_type, round_to
        self.sizes: dict[int, int] = {}
        self.current = self.peak = 0
        self.peak_at = "start"
        self.phase = "start"
        self.rows: list[tuple[int, str, str, int]] = []
        self._lock = threading.Lock()

    def _forget(self, key: int) -> None:
        with self._lock:
            self.current -= self.sizes.pop(key, 0)

    def track(self, tensor: Any) -> None:
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != self.device_type:
            return
        storage = tensor.untyped_storage()
        key = storage._cdata  # one StorageImpl, however many tensors and views share it
        with self._lock:
            if key in self.sizes:
                return
            self.sizes[key] = _rounded(storage.nbytes(), self.round_to)
            self.current += self.sizes[key]
        weakref.finalize(storage, self._forget, key)

    def note(self, what: str) -> None:
        if self.current > self.peak:
            self.peak, self.peak_at = self.current, f"{self.phase}: {what}"
        self.rows.append((len(self.rows), self.phase, what, self.current))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            self.track(tensor)
        self.note(str(func.overloadpacket.__name__))
        return out


def _storages(tensors: Iterable[Any], round_to: int) -> dict[int, int]:
    found: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == "meta":
            storage = t.untyped_storage()
            found[storage._cdata] = _rounded(storage.nbytes(), round_to)
    return found


def saved_tensor_bytes(fn: Callable[[], Any], *, exclude: Iterable[torch.Tensor] = (),
                       round_to: int = 1) -> tuple[int, Any]:
    """Bytes of the storages autograd saves for the backward pass while ``fn()`` runs (chapter 13).

    Each storage is counted once, however many tensors or views of it are saved, and storages
    of ``exclude`` (the parameters, the inputs: they exist anyway) are left out. Works on
    every device, ``meta`` included. Returns the bytes and what ``fn()`` returned, so the
    caller can keep the graph alive or run its backward pass.
    """
    skip = {t.untyped_storage()._cdata for t in exclude}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in skip:
            saved[storage._cdata] = _rounded(storage.nbytes(), round_to)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn()
    return sum(saved.values()), result


@dataclass(frozen=True)
class MemoryPrediction:
    """What :func:`predict_training_memory` returns, in bytes (chapter 13).

    ``peak`` is the largest total of live storages during one repeating training step;
    ``peak_at`` names the phase and operation where it happens; ``timeline`` has the live
    bytes after every operation of that step (columns ``op``, ``phase``, ``name``, ``bytes``).
    """

    model: str
    batch_size: int
    accumulate: int
    optimizer: str
    weights: int
    gradients: int
    optimizer_state: int
    saved_activations: int
    inputs: int
    peak: int
    peak_at: str
    round_to: int
    timeline: pd.DataFrame = field(repr=False, compare=False)

    @property
    def between_steps(self) -> int:
        """Bytes alive between two steps: weights, gradients, optimizer state and the batch."""
        return int(self.timeline["bytes"].iloc[0])

    @property
    def sum_of_parts(self) -> int:
        """Weights + gradients + optimizer state + saved activations + the batch."""
        return (self.weights + self.gradients + self.optimizer_state + self.saved_activations
                + self.inputs)

    @property
    def at_forward(self) -> int:
        """Bytes alive when the (first) forward pass starts, after ``zero_grad``."""
        rows = self.timeline[self.timeline["phase"] == "forward"]
        return int(rows["bytes"].iloc[0])

    @property
    def step_increase(self) -> int:
        """How far the step raises memory above :attr:`at_forward`: what
        :func:`measure_step_peak` measures for a step whose gradients were already freed."""
        return self.peak - self.at_forward

    def table(self) -> pd.DataFrame:
        """The prediction as a table: one row per part, in MiB and as a share of the peak."""
        parts = {
            "weights (parameters, buffers)": self.weights,
            "gradients": self.gradients,
            "optimizer state": self.optimizer_state,
            "saved activations": self.saved_activations,
            "batch (inputs, targets)": self.inputs,
            "sum of the parts": self.sum_of_parts,
            "predicted peak of a step": self.peak,
        }
        frame = pd.DataFrame({"MiB": [v / MiB for v in parts.values()],
                              "share of peak": [v / self.peak for v in parts.values()]},
                             index=pd.Index(list(parts), name=f"{self.model}, batch "
                                            f"{self.batch_size}, {self.optimizer}"))
        return frame


def _model_name(model: Any) -> str:
    if isinstance(model, functools.partial):
        return _model_name(model.func)
    if isinstance(model, nn.Module):
        return type(model).__name__
    return getattr(model, "__name__", type(model).__name__)


def _on_meta(model: nn.Module | Callable[[], nn.Module]) -> nn.Module:
    """A copy of ``model`` on the meta device, made without copying any data."""
    if isinstance(model, nn.Module):
        # deepcopy with every parameter and buffer already mapped to an empty meta twin:
        # the structure is copied, no tensor data is.
        memo: dict[int, Any] = {}
        for p in model.parameters():
            memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"),
                                       requires_grad=p.requires_grad)
        for b in model.buffers():
            memo[id(b)] = torch.empty_like(b, device="meta")
        return copy.deepcopy(model, memo)
    if not callable(model):
        raise TypeError(f"model must be an nn.Module or a function that builds one, got "
                        f"{type(model).__name__}: pass e.g. MyModel() or lambda: MyModel(...)")
    try:
        with torch.device("meta"):
            built = model()
    except Exception as exc:
        raise RuntimeError(
            f"{_model_name(model)} could not be built on the meta device ({exc}). Its "
            "__init__ must not read tensor values (.item(), numpy, loading weights): build it "
            "without them, or pass an instance (it is copied to meta without its data)"
        ) from exc
    if not isinstance(built, nn.Module):
        raise TypeError(f"{_model_name(model)}() returned {type(built).__name__}, not an "
                        "nn.Module")
    real = [name for name, t in [*built.named_parameters(), *built.named_buffers()]
            if t.device.type != "meta"]
    if real:
        raise RuntimeError(f"{_model_name(model)} created {real[0]!r} on a real device even "
                           "inside torch.device('meta'): create its tensors without an "
                           "explicit device= so that they follow the default device")
    return built


def predict_training_memory(
    model: nn.Module | Callable[[], nn.Module],
    input_shape: tuple[int, ...],
    batch_size: int,
    *,
    optimizer: str | Callable[..., torch.optim.Optimizer] = "adam",
    input_dtype: torch.dtype = torch.float32,
    loss: str | Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = "cross_entropy",
    accumulate: int = 1,
    set_to_none: bool = True,
    round_to: int = CUDA_BLOCK,
    foreach: bool | None = None,
) -> MemoryPrediction:
    """Predict the memory of one training step, with no GPU and no memory used (chapter 13).

    ``model`` is an ``nn.Module`` (copied to the meta device without its data) or a function
    that builds one (called inside ``torch.device("meta")``). ``input_shape`` is the shape of
    one example, ``batch_size`` the (micro-)batch. ``optimizer`` is ``"sgd"``,
    ``"sgd_momentum"``, ``"adam"``, ``"adamw"`` or ``params -> Optimizer``; ``loss`` is
    ``"cross_entropy"`` (class targets), ``"mse"`` or ``(output, target) -> loss`` (with a
    target of zeros shaped like the output). ``accumulate`` micro-batches add into the
    gradients before each ``step()``. ``foreach`` is the optimizer's multi-tensor setting:
    ``None`` predicts for a CUDA GPU (where PyTorch picks it) when ``round_to`` is 512.

    Two steps run on meta: the first creates the optimizer state, the second (the one every
    later step repeats) is the one predicted. The **peak** is the largest total of the
    storages alive during it, each rounded up to ``round_to`` bytes (512 as the CUDA caching
    allocator does; 1 for the CPU). Memory outside the tensors torch creates (the CUDA
    context, cuBLAS and cuDNN workspaces, scratch space inside kernels) is not included:
    :func:`measure_training_memory` measures the workspaces on the device.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive whole number, got {batch_size!r}")
    if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate <= 0:
        raise ValueError(f"accumulate must be a positive whole number, got {accumulate!r}")
    if not isinstance(round_to, int) or round_to <= 0:
        raise ValueError(f"round_to must be a positive number of bytes, got {round_to!r}")
    if isinstance(input_shape, int) or not all(isinstance(s, int) and s > 0
                                                 for s in input_shape):
        raise ValueError(f"input_shape is the shape of one example, a tuple of positive "
                         f"sizes such as (1, 28, 28), got {input_shape!r}")
    if isinstance(loss, str) and loss not in _LOSSES:
        raise ValueError(f"unknown loss {loss!r}: use one of {sorted(_LOSSES)} or a function "
                         "(output, target) -> loss")
    if isinstance(optimizer, str) and optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}: use one of {sorted(OPTIMIZERS)} "
                         "or a function params -> torch.optim.Optimizer")
    name = _model_name(model)
    meta = _on_meta(model).train()
    params = [p for p in meta.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{name} has no parameters that require gradients: there is "
                         "nothing to train")
    if foreach is None and round_to == CUDA_BLOCK and not callable(optimizer):
        foreach = True  # what torch.optim picks on a CUDA GPU
    opt = make_optimizer(optimizer, params, foreach=foreach)
    x = torch.empty((batch_size, *input_shape), dtype=input_dtype, device="meta")
    loss_fn = _LOSSES[loss] if isinstance(loss, str) else loss
    try:
        with torch.no_grad():
            target = _target_like(meta(x), loss if isinstance(loss, str) else "mse")
        training_step(meta, opt, x, target, loss_fn, accumulate=accumulate,
                      set_to_none=set_to_none)
    except Exception as exc:
        raise RuntimeError(
            f"one training step of {name} failed on the meta device: {exc}. Meta tensors "
            "have no values, so code that reads them (.item(), if tensor > 0, nonzero, "
            "boolean masks) cannot run there; predict the model without that part, or check "
            "input_shape and input_dtype against what the model expects") from exc

    round_bytes = lambda tensors: sum(_storages(tensors, round_to).values())  # noqa: E731
    weights = round_bytes([*meta.parameters(), *meta.buffers()])
    state = round_bytes(v for s in opt.state.values() for v in s.values())
    inputs = round_bytes([x, target])

    tracker = _LiveStorages("meta", round_to)
    for t in [*meta.parameters(), *meta.buffers(), x, target,
              *(p.grad for p in params if p.grad is not None),
              *(v for s in opt.state.values() for v in s.values())]:
        tracker.track(t)
    tracker.note("between steps")
    saved = 0
    exclude = [*meta.parameters(), *meta.buffers(), x, target]

    def counted_model(inp: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        count, out = saved_tensor_bytes(lambda: loss_fn(meta(inp), target), exclude=exclude,
                                        round_to=round_to)
        saved = max(saved, count)
        return out

    def phase(name: str) -> None:
        tracker.phase = name
        tracker.note("starts")

    with tracker:
        training_step(counted_model, opt, x, target, lambda out, tgt: out,
                      accumulate=accumulate, set_to_none=set_to_none, phase=phase)
    grads = round_bytes(p.grad for p in params if p.grad is not None)
    timeline = pd.DataFrame(tracker.rows, columns=["op", "phase", "name", "bytes"])
    return MemoryPrediction(
        model=name, batch_size=batch_size, accumulate=accumulate,
        optimizer=optimizer if isinstance(optimizer, str) else _model_name(optimizer),
        weights=weights, gradients=grads, optimizer_state=state, saved_activations=saved,
        inputs=inputs, peak=tracker.peak, peak_at=tracker.peak_at, round_to=round_to,
        timeline=timeline)


#: Autocast's cast policies for the common layers, from torch's lists
#: (aten/src/ATen/autocast_mode.h and autocast_mode.cpp, the same from torch 2.9 to 2.14):
#: matrix products and convolutions run in 16 bits on every device; which ops run in float32
#: differs. On CUDA layer norm, group norm, the losses and (with ``dtype=float32``) softmax
#: and log-softmax do; on the CPU the losses do, but layer norm and softmax keep their input's
#: 16 bits. Ops in no list run in their input's dtype (widest input where they mix).
_AUTOCAST_LOW = {"linear", "matmul", "mm", "addmm", "bmm", "baddbmm", "conv1d", "conv2d",
                 "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                 "prelu", "scaled_dot_product_attention"}
_AUTOCAST_FP32 = {
    "cuda": {"layer_norm", "group_norm", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss",
             "huber_loss", "kl_div", "binary_cross_entropy_with_logits", "softplus", "exp",
             "log", "pow", "rsqrt", "logsumexp", "cosine_similarity"},
    "cpu": {"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss",
            "huber_loss", "kl_div", "binary_cross_entropy_with_logits"},
}
_AUTOCAST_FP32_DTYPE = {"cuda": {"softmax", "log_softmax", "cumsum", "cumprod"}, "cpu": set()}


class _AutocastPolicy(torch.overrides.TorchFunctionMode):
    """Applies autocast's cast policy for ``device_type`` to meta tensors, which torch's own
    autocast never sees (it acts on the tensors of its own device type only)."""

    def __init__(self, device_type: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.device_type, self.dtype = device_type, dtype
        self.copies: dict[int, torch.Tensor] = {}  # autocast caches the weights' casts

    def cast(self, value: Any, dtype: torch.dtype) -> Any:
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() \
                or value.dtype == dtype:
            return value
        if dtype == self.dtype and value.is_leaf and value.requires_grad:
            if id(value) not in self.copies:
                self.copies[id(value)] = value.to(dtype)
            return self.copies[id(value)]
        return value.to(dtype)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _AUTOCAST_LOW:
            to = self.dtype
        elif name in _AUTOCAST_FP32[self.device_type]:
            to = torch.float32
        elif name in _AUTOCAST_FP32_DTYPE[self.device_type] and kwargs.get("dtype") is None:
            return func(*args, **{**kwargs, "dtype": torch.float32})
        elif name == "cross_entropy" and self.device_type == "cuda":
            # CUDA has no entry for cross_entropy: it runs as its parts, and its C++
            # (cross_entropy_loss_symint, LossNLL.cpp) asks log_softmax for the input's
            # own dtype, which autocast respects: the 16-bit log-probabilities are saved,
            # then nll_loss (float32 list) saves a float32 copy of them as well
            # (label smoothing, which adds more, is left out)
            logits, target = args[:2]
            log_p = nn.functional.log_softmax(logits, 0 if logits.dim() == 1 else 1,
                                              dtype=logits.dtype)
            keep = {k: kwargs[k] for k in ("weight", "ignore_index", "reduction")
                    if k in kwargs}
            return nn.functional.nll_loss(self.cast(log_p, torch.float32), target, **keep)
        else:
            return func(*args, **kwargs)
        return func(*[self.cast(a, to) for a in args],
                    **{k: self.cast(v, to) for k, v in kwargs.items()})


def predict_autocast_saved(
    model: nn.Module | Callable[[], nn.Module],
    input_shape: tuple[int, ...],
    batch_size: int,
    *,
    device_type: str,
    dtype: torch.dtype = torch.bfloat16,
) -> int:
    """Predict the bytes saved for backward in a forward pass under autocast (chapter 13).

    The forward pass and its cross-entropy loss run on the meta device with autocast's
    cast policy for ``device_type`` (``"cuda"`` or ``"cpu"``, from torch's op lists)
    applied to the layers it knows (linear, convolutions, layer norm, softmax, the losses);
    counted as :func:`saved_tensor_bytes` counts (parameters and the batch left out). The
    16-bit copies autocast makes of the weights are saved too, and counted.
    """
    if device_type not in _AUTOCAST_FP32:
        raise ValueError(f"device_type is 'cuda' or 'cpu' (the lists this predicts from), "
                         f"got {device_type!r}")
    meta = _on_meta(model).train()
    x = torch.empty((batch_size, *input_shape), device="meta")
    with torch.no_grad():
        target = _target_like(meta(x), "cross_entropy")
    policy = _AutocastPolicy(device_type, dtype)

    def forward() -> torch.Tensor:
        with policy:
            return nn.functional.cross_entropy(meta(x), target)

    saved, _ = saved_tensor_bytes(forward, exclude=[*meta.parameters(), *meta.buffers(),
                                                    x, target])
    return saved


def _cpu_allocations(prof: torch.profiler.profile) -> list[tuple[int, int]]:
    """(time, bytes) of every CPU allocation (+) and free (-) the profiler recorded."""
    from torch._C._profiler import _EventType

    found: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            found.append((event.start_time_ns, event.extra_fields.alloc_size))
    return sorted(found)


def _cpu_profile() -> torch.profiler.profile:
    """A profiler that records the CPU allocator's allocations and frees."""
    # acc_events=True: one profiling cycle, so nothing changes in what is recorded, but torch
    # 2.10 and 2.11 warn "Profiler clears events at the end of each cycle" whenever it is False
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  profile_memory=True, acc_events=True)


def _running_peak(prof: torch.profiler.profile) -> tuple[int, int]:
    """The highest and the final running total of the CPU allocations ``prof`` recorded."""
    running = peak = 0
    for _, nbytes in _cpu_allocations(prof):
        running += nbytes
        peak = max(peak, running)
    return peak, running


def measure_step_peak(fn: Callable[[], Any], device: torch.device | str) -> tuple[int, int]:
    """Measure how far ``fn()`` raises the memory allocated on ``device`` (chapter 13).

    Returns ``(peak, end)``: the highest and the final allocated bytes during ``fn()``, both
    relative to the moment it starts. On a CUDA GPU they come from the caching allocator
    (``torch.cuda.max_memory_allocated(device)`` after ``reset_peak_memory_stats(device)``);
    on the CPU from the allocations and frees of PyTorch's CPU allocator that
    ``torch.profiler.profile(profile_memory=True)`` records. The profiler does not see frees
    of memory allocated before it started, so free what ``fn()`` would free first (for a
    training step: ``opt.zero_grad(set_to_none=True)`` before measuring).
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before,
                torch.cuda.memory_allocated(device) - before)
    if device.type == "cpu":
        with _cpu_profile() as prof:
            fn()
        return _running_peak(prof)
    raise ValueError(f"measure_step_peak measures on 'cpu' or a CUDA GPU, not {device}: "
                     "other devices keep no peak statistics; predict with "
                     "predict_training_memory instead")


def _training_setup(
    model: Callable[[], nn.Module], input_shape: tuple[int, ...], batch_size: int,
    device: torch.device | str, optimizer: str | Callable[..., torch.optim.Optimizer],
    accumulate: int, set_to_none: bool, seed: int, what: str,
) -> tuple[Callable[..., None], int, torch.device]:
    """The step measure_training_peak and measure_training_memory measure, and the bytes
    alive before it starts."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive whole number, got {batch_size!r}")
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{what} measures on 'cpu' or a CUDA GPU, not "
                         f"{device}: other devices keep no peak statistics")
    baseline = 0
    if device.type == "cuda":
        # cuBLAS takes its workspace from the caching allocator at the first matrix product
        # on a device and keeps it for the process: create it before the baseline, so every
        # configuration measures its own step, whichever runs first
        w = torch.ones(8, 8, device=device, requires_grad=True)
        nn.functional.linear(w, w, w[0]).sum().backward()
        del w
        torch.cuda.synchronize(device)
        baseline = torch.cuda.memory_allocated(device)
    torch.manual_seed(seed)
    net = model().to(device).train()
    opt = make_optimizer(optimizer, net.parameters(),
                         foreach=True if device.type == "cuda" else None)
    x = torch.randn((batch_size, *input_shape), device=device)
    with torch.no_grad():
        classes = net(x[:1]).shape[-1]
    y = torch.randint(0, classes, (batch_size,), device=device)

    def step(phase: Callable[[str], None] | None = None) -> None:
        training_step(net, opt, x, y, _cross_entropy, accumulate=accumulate,
                      set_to_none=set_to_none, phase=phase)

    step()
    opt.zero_grad(set_to_none=set_to_none)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device) - baseline
    else:
        # Adam's step counters are one-number tensors kept on the CPU whatever the device;
        # the prediction leaves them out, and so does this count
        state = [v for s in opt.state.values() for v in s.values() if v.dim() > 0]
        grads = [] if set_to_none else [p.grad for p in net.parameters()]
        start = _storage_bytes([*net.parameters(), *net.buffers(), x, y, *state, *grads])
    return step, start, device


def measure_training_peak(
    model: Callable[[], nn.Module],
    input_shape: tuple[int, ...],
    batch_size: int,
    device: torch.device | str,
    *,
    optimizer: str | Callable[..., torch.optim.Optimizer] = "adam",
    accumulate: int = 1,
    set_to_none: bool = True,
    seed: int = 0,
) -> int:
    """Measure the peak bytes of the step :func:`predict_training_memory` predicts (chapter 13).

    Builds ``model()`` on ``device`` with random inputs and class targets, runs one step (which
    creates the optimizer state), frees the gradients, then measures one more step. Returns
    the bytes alive at its peak: on a CUDA GPU ``max_memory_allocated(device)`` less what was
    allocated before the model was built (after cuBLAS has made the workspace it keeps for
    the process); on the CPU the storages of the model, optimizer state and batch plus the
    peak the profiler records (:func:`measure_step_peak`). Both include the scratch memory
    (workspace) that kernels take from PyTorch's allocator while they run, which the
    prediction cannot see: :func:`measure_training_memory` measures it per operation.
    """
    step, start, device = _training_setup(model, input_shape, batch_size, device, optimizer,
                                          accumulate, set_to_none, seed,
                                          "measure_training_peak")
    increase, _ = measure_step_peak(step, device)
    return start + increase


#: The name of the profiler range each operation of a step measured on the CPU runs in.
_OP_MARK = "helpers.memory: op "


class _OpScratch(TorchDispatchMode):
    """Runs a step on a real device and measures each operation's scratch memory: the bytes
    it takes from the allocator and gives back before it returns, above what it leaves.

    On a CUDA GPU from the caching allocator (peak reset before each operation; ``top``
    keeps the highest value seen across the resets); on the CPU each operation runs in a
    profiler range named ``_OP_MARK + index``, read afterwards by :func:`_marked_scratch`.
    """

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.names: list[str] = []
        self.phases: list[str] = []
        self.phase = "start"
        self.scratch: dict[int, int] = {}
        self.top = 0

    def mark(self, phase: str) -> None:
        self.phase = phase

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        index = len(self.names)
        self.names.append(str(func.overloadpacket.__name__))
        self.phases.append(self.phase)
        if self.device.type != "cuda":
            with torch.profiler.record_function(f"{_OP_MARK}{index}"):
                return func(*args, **(kwargs or {}))
        device = self.device
        self.top = max(self.top, torch.cuda.max_memory_allocated(device))
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        out = func(*args, **(kwargs or {}))
        after = torch.cuda.memory_allocated(device)
        self.scratch[index] = max(0, torch.cuda.max_memory_allocated(device)
                                  - max(before, after))
        return out


def _scratch_of(allocations: list[tuple[int, int]]) -> int:
    """How far a run of (time, +bytes / -bytes) rose above both where it began and ended."""
    running = top = 0
    for _, nbytes in sorted(allocations, key=lambda a: a[0]):
        running += nbytes
        top = max(top, running)
    return top - max(0, running)


def _marked_scratch(prof: torch.profiler.profile) -> dict[int, int]:
    """Scratch bytes per operation index from the CPU profile of an :class:`_OpScratch` run."""
    from torch._C._profiler import _EventType

    found: dict[int, int] = {}
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.tag == _EventType.TorchOp and event.name.startswith(_OP_MARK):
            allocations, inner = [], [event]
            while inner:
                e = inner.pop()
                inner.extend(e.children)
                if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu":
                    allocations.append((e.start_time_ns, e.extra_fields.alloc_size))
            found[int(event.name[len(_OP_MARK):])] = _scratch_of(allocations)
        else:
            stack.extend(event.children)
    return found


@dataclass(frozen=True)
class MeasuredStep:
    """What :func:`measure_training_memory` returns, in bytes (chapter 13).

    ``peak`` is what :func:`measure_training_peak` returns and ``start`` the bytes alive
    when the step starts (weights, optimizer state, the batch); ``ops`` has one row per
    operation of the measured step (``name``, ``phase``, ``scratch``): the workspace each one
    took from PyTorch's allocator and gave back before it returned (cuDNN's convolution
    workspace on a GPU, oneDNN's scratchpad on a CPU), measured on the device.
    """

    device: str
    peak: int
    start: int
    ops: pd.DataFrame = field(repr=False, compare=False)

    @property
    def workspace(self) -> int:
        """The largest scratch memory one operation took."""
        return int(self.ops["scratch"].max()) if len(self.ops) else 0

    @property
    def workspace_op(self) -> str:
        """The operation that took :attr:`workspace` (``""`` when none took any)."""
        if not self.workspace:
            return ""
        return str(self.ops.loc[self.ops["scratch"].idxmax(), "name"])

    def with_prediction(self, prediction: MemoryPrediction) -> int:
        """The predicted peak with each operation's measured workspace added at its moment.

        For every operation of the predicted step: the live tensors around it on meta (the
        larger of before and after it) plus the scratch the same operation (matched by name
        and by how many of that name ran before it) took on the device; the largest of these
        and the predicted peak. An operation the replay did not run adds its scratch to the
        predicted peak.
        """
        line = prediction.timeline
        seen: dict[str, int] = {}
        scratch: dict[tuple[str, int], int] = {}
        for name, nbytes in zip(self.ops["name"], self.ops["scratch"], strict=True):
            seen[name] = seen.get(name, 0) + 1
            scratch[(name, seen[name])] = int(nbytes)
        best, before, seen = prediction.peak, 0, {}
        for name, after in zip(line["name"], line["bytes"], strict=True):
            if name not in ("starts", "between steps"):
                seen[name] = seen.get(name, 0) + 1
                best = max(best, max(before, after) + scratch.pop((name, seen[name]), 0))
            before = after
        return max(best, prediction.peak + max(scratch.values(), default=0))


def measure_training_memory(
    model: Callable[[], nn.Module],
    input_shape: tuple[int, ...],
    batch_size: int,
    device: torch.device | str,
    *,
    optimizer: str | Callable[..., torch.optim.Optimizer] = "adam",
    accumulate: int = 1,
    set_to_none: bool = True,
    seed: int = 0,
) -> MeasuredStep:
    """Measure a training step's peak and every operation's workspace on ``device`` (chapter 13).

    The same step as :func:`measure_training_peak`, run once with each operation watched
    (a ``TorchDispatchMode``): on a CUDA GPU the caching allocator's peak is reset before
    each operation and read after it; on the CPU each operation runs in a profiler range.
    An operation's *scratch* is how far the allocated bytes rose above both their level
    before it and after it: memory a library took for itself and gave back (cuDNN's
    convolution workspace, oneDNN's scratchpad, whose size grows with the CPU's threads).
    The meta replay cannot see it; :meth:`MeasuredStep.with_prediction` adds it.

    On a GPU this resets the device's peak statistics, as :func:`measure_step_peak` does
    (the step's own peak is kept across the resets): read a peak of your own before calling
    it. The warm-up step before the measured one makes cuDNN's plans (and with
    ``torch.backends.cudnn.benchmark`` its timing trials) and cuBLAS's workspaces, so the
    measured step runs the algorithms every later step runs.
    """
    step, start, device = _training_setup(model, input_shape, batch_size, device, optimizer,
                                          accumulate, set_to_none, seed,
                                          "measure_training_memory")
    watch = _OpScratch(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        with watch:
            step(phase=watch.mark)
        torch.cuda.synchronize(device)
        increase = max(watch.top, torch.cuda.max_memory_allocated(device)) - before
        scratch = watch.scratch
    else:
        with _cpu_profile() as prof, watch:
            step(phase=watch.mark)
        increase, _ = _running_peak(prof)
        scratch = _marked_scratch(prof)
    if not any("backward" in name  # nll_loss_backward at least (the step's loss)
               for name, phase in zip(watch.names, watch.phases, strict=True)
               if phase == "backward"):
        # the mode is thread-local state that autograd's engine hands to the thread that
        # runs backward (a thread per GPU on CUDA): without it the backward pass, where
        # cuDNN's largest workspaces are, would go unmeasured
        raise RuntimeError(
            f"measure_training_memory saw no operation of the backward pass on {device} "
            f"(torch {torch.__version__} did not pass its TorchDispatchMode to autograd's "
            "backward thread): use measure_training_peak for the peak alone")
    ops = pd.DataFrame({"name": watch.names, "phase": watch.phases,
                        "scratch": [scratch.get(i, 0) for i in range(len(watch.names))]})
    return MeasuredStep(device=str(device), peak=start + increase, start=start, ops=ops)


def measurable(device: torch.device | str) -> torch.device:
    """The device whose peak memory can be measured: ``device`` itself on a CUDA GPU and on
    the CPU, the CPU elsewhere (chapter 13).

    Only CUDA's caching allocator (``max_memory_allocated``) and the CPU profiler record a
    peak; ``mps`` reports what is allocated now (``torch.mps.current_allocated_memory()``,
    and ``torch.mps.driver_allocated_memory()`` for all Metal holds), not the highest value.
    """
    device = torch.device(device)
    return device if device.type in ("cpu", "cuda") else torch.device("cpu")


def column_sum_staging(rows: int, cols: int, sms: int, threads_per_sm: int) -> int:
    """The bytes PyTorch's CUDA reduction kernel takes from the caching allocator, and gives
    back, to sum a contiguous float32 ``[rows, cols]`` tensor over its rows (chapter 13).

    A bias's gradient is such a sum: its output's gradient summed over the batch. When each
    output has many rows to add, ``setReduceConfig`` (``aten/src/ATen/native/cuda/Reduce.cuh``)
    splits the rows across ``ctas_per_output`` thread blocks, enough to fill the GPU's
    ``sms`` multiprocessors (``threads_per_sm`` threads each), and the blocks stage their
    partial sums in a buffer of ``4 * cols * ctas_per_output * block.x * output_vec_size``
    bytes, plus one ``int`` semaphore per block column, each request rounded up to 512
    bytes. Returns 0 where the kernel needs no such buffer. ``sms`` and ``threads_per_sm``
    are ``multi_processor_count`` and ``max_threads_per_multi_processor`` of
    ``torch.cuda.get_device_properties(device)``. NVIDIA GPUs (ROCm splits otherwise), and a
    tensor under 2 GiB (larger ones are reduced in pieces).
    """
    for name, value in (("rows", rows), ("cols", cols), ("sms", sms),
                        ("threads_per_sm", threads_per_sm)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    if cols < 2 or 4 * rows * cols >= 2**31:
        raise ValueError(f"column_sum_staging knows a [rows, cols] float32 tensor with at least "
                         f"two columns and under 2 GiB, got [{rows}, {cols}]")

    def div_up(a: int, b: int) -> int:
        return -(-a // b)

    def pow2(n: int, most: int) -> int:  # the largest power of two up to n, at most `most`
        return most if n >= most else 1 << (n.bit_length() - 1)

    vec = 4  # output_vec_size: neighbouring outputs loaded together
    while cols % vec:
        vec //= 2
    most = 512 // vec  # the kernel's 512 threads, shared by the vector
    dim0, dim1 = pow2(cols // vec, most), pow2(rows, most)
    height = min(dim1, most // min(dim0, 32))
    width = min(dim0, most // height)  # block.x: outputs side by side
    if rows < min(height * 16, 256):
        return 0  # each warp sums its own outputs: nothing is staged
    per_thread = div_up(rows, height)
    grid = div_up(cols // vec, width)  # blocks along the outputs
    target = sms * (threads_per_sm // (width * height))  # blocks that fill the GPU
    if per_thread < 256 or grid > target:
        return 0
    ctas = max(min(div_up(target, grid), div_up(per_thread, 16)), div_up(per_thread, 256))
    if ctas <= 1:
        return 0
    staged, semaphores = 4 * cols * ctas * width * vec, 4 * grid
    return sum(div_up(n, CUDA_BLOCK) * CUDA_BLOCK for n in (staged, semaphores))


def _storage_bytes(tensors: Iterable[Any]) -> int:
    found: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            found[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
    return sum(found.values())


_UNITS = {"B": 1, "bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SIZE = r"([\d.]+) (B|bytes|KiB|MiB|GiB|TiB)"
_OOM_PARTS = [
    ("tried to allocate", rf"Tried to allocate {_SIZE}",
     "the request that failed (rounded up to 512 bytes)", "the tensor being created"),
    ("total capacity", rf"has a total capacity of {_SIZE}",
     "all memory of the GPU", "torch.cuda.mem_get_info(device)[1]"),
    ("free", rf"of which {_SIZE} is free",
     "what the driver has left for anyone", "torch.cuda.mem_get_info(device)[0]"),
    # one "Process N has ..." per other process on the GPU (every process, this one
    # included, in a container where NVML cannot match process ids)
    ("process {pid}", rf"Process (\d+) has {_SIZE} memory in use",
     "another program on the GPU, or this one inside a container", "nvidia-smi"),
    ("this process", rf"this process has {_SIZE} memory in use",
     "everything this process holds: CUDA context, allocator, libraries",
     "total - free - other processes"),
    ("allowed", rf"{_SIZE} allowed;",
     "the cap set with torch.cuda.set_per_process_memory_fraction", "fraction * total"),
    ("allocated by PyTorch", rf"{_SIZE} is allocated by PyTorch",
     "live tensors", "torch.cuda.memory_allocated(device)"),
    ("in private pools", rf"with {_SIZE} allocated in private pools",
     "part of the above held by CUDA graphs' private pools",
     "torch.cuda.memory_stats(device)"),
    ("reserved but unallocated", rf"{_SIZE} is reserved by PyTorch but unallocated",
     "cached blocks no tensor uses (freed tensors, fragments)",
     "torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)"),
]


def read_oom_message(message: str) -> pd.DataFrame:
    """Split a CUDA out-of-memory message into its figures (chapter 13).

    One row per part the message has (tried to allocate, total capacity, free, one row
    ``process <pid>`` per process it names, this process, allowed, allocated by PyTorch,
    in private pools, reserved but unallocated) with its size in MiB, what it means and the
    statistic that gives it in a running program.
    """
    if not isinstance(message, str) or "out of memory" not in message:
        raise ValueError("read_oom_message needs the text of a CUDA out-of-memory error, such "
                         "as str(exc) for a torch.OutOfMemoryError; got "
                         f"{str(message)[:60]!r}")
    rows = []
    for part, pattern, meaning, statistic in _OOM_PARTS:
        for found in re.finditer(pattern, message):
            *pid, number, unit = found.groups()
            rows.append({"part": part.format(pid=pid[0] if pid else ""),
                         "MiB": float(number) * _UNITS[unit] / MiB, "means": meaning,
                         "statistic": statistic})
    if not rows:
        raise ValueError("no sizes found in the message: pass the whole text of the error")
    return pd.DataFrame(rows).set_index("part")


def plot_step_memory(prediction: MemoryPrediction, *, title: str | None = None):
    """Live memory after every operation of the predicted step, by phase (chapter 13).

    Returns a matplotlib Figure: MiB on the y axis, the operations in the order torch ran
    them on the x axis, one colour per phase (forward, backward, optimizer step) and the
    predicted peak marked.
    """
    import matplotlib.pyplot as plt

    line = prediction.timeline
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for phase, rows in line.groupby("phase", sort=False):
        ax.plot(rows["op"], rows["bytes"] / MiB, ".", markersize=3, label=phase)
    ax.axhline(prediction.peak / MiB, color="grey", linestyle="--", linewidth=1,
               label=f"peak {prediction.peak / MiB:,.1f} MiB")
    ax.set_xlabel("operations of one training step, in the order torch runs them")
    ax.set_ylabel("live tensors (MiB)")
    ax.set_title(title or f"{prediction.model}, batch {prediction.batch_size}, "
                 f"{prediction.optimizer}: predicted on meta")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def show_figure(fig: Any, alt: str) -> None:
    """Display a matplotlib figure as a PNG with alt text for screen readers (chapter 13)."""
    import base64
    import io
    from html import escape

    import matplotlib.pyplot as plt
    from IPython.display import HTML, display

    if not alt.strip():
        raise ValueError("alt text describes the figure in words; it cannot be empty")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    data = base64.b64encode(buffer.getvalue()).decode()
    display(HTML(f'<img src="data:image/png;base64,{data}" alt="{escape(alt)}">'))
