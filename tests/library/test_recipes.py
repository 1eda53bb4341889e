"""The ``recipes`` benchmark workload (chapter 12): a quick run on the CPU and its pieces."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from helpers import recipes


def test_recipes_for_the_cpu_leave_out_cuda_only_ones() -> None:
    names = recipes.recipes_for(torch.device("cpu"))
    assert names[0] == "plain"
    assert {"bf16_autocast", "channels_last"} <= set(names)
    assert not {"fp16_autocast_gradscaler", "cudnn_benchmark", "pinned_non_blocking"} & set(names)


@pytest.mark.parametrize("recipe", ["plain", "bf16_autocast", "channels_last"])
def test_each_cpu_step_trains(recipe: str) -> None:
    step = recipes.make_step(recipe, torch.device("cpu"), batch_size=16)
    losses = [step().item() for _ in range(5)]
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0], f"{recipe}: five steps on one batch should lower the loss"


def test_cuda_only_recipe_is_refused_on_cpu() -> None:
    with pytest.raises(ValueError, match="does not apply"):
        recipes.make_step("cudnn_benchmark", torch.device("cpu"))


def test_cudnn_flag_is_restored() -> None:
    before = torch.backends.cudnn.benchmark
    recipes.make_step("plain", torch.device("cpu"), batch_size=4)()
    assert torch.backends.cudnn.benchmark == before


def test_recipe_steps_share_one_class_and_only_compile_compiles() -> None:
    from torch._dynamo.eval_frame import OptimizedModule

    plain = recipes.make_step("plain", torch.device("cpu"), batch_size=4).recipe_step
    assert plain.net is plain.model and not isinstance(plain.net, OptimizedModule)
    assert isinstance(recipes.RecipeStep("channels_last", "cpu").model, torch.nn.Module)


# slow: it runs first on several workers. A cold compile (no inductor cache on disk) took
# 21 s alone on an idle 2-core machine and 134 s on the H200's server beside other tests; begun
# last, it would keep one worker busy long after the others (the GPU report's tests part).
@pytest.mark.slow
def test_compile_recipe_really_compiles_on_cpu() -> None:
    """The compile recipe runs an ``OptimizedModule`` and dynamo compiles a graph for it."""
    from torch._dynamo.eval_frame import OptimizedModule
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # forget graphs compiled by earlier tests, so this one must compile
    counters.clear()
    # Chapter 12's CPU shapes: inductor's on-disk cache then serves the chapter's compilation.
    step = recipes.make_step("compile", torch.device("cpu"), batch_size=recipes.BATCH_SIZE)
    assert isinstance(step.recipe_step.net, OptimizedModule)
    assert step.recipe_step.net._orig_mod is step.recipe_step.model
    losses = [step().item() for _ in range(3)]
    assert counters["stats"]["unique_graphs"] >= 1, dict(counters["stats"])
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    graphs = counters["stats"]["unique_graphs"]
    step()
    assert counters["stats"]["unique_graphs"] == graphs, "a batch of the same shape recompiled"


@pytest.mark.parametrize(("capability", "has_bf16"), [((7, 5), False), ((8, 0), True), ((9, 0), True)])
def test_bf16_is_left_out_below_compute_capability_8(monkeypatch, capability, has_bf16) -> None:
    asked = []

    def fake_capability(device):
        asked.append(device)
        return capability

    monkeypatch.setattr(torch.cuda, "get_device_capability", fake_capability)
    monkeypatch.setattr(torch.version, "hip", None)
    names = recipes.recipes_for(torch.device("cuda:1"))
    assert ("bf16_autocast" in names) is has_bf16
    assert "fp16_autocast_gradscaler" in names and "compile" in names
    assert asked and all(torch.device(d) == torch.device("cuda:1") for d in asked)
    assert recipes.bf16_is_fast(torch.device("cpu"))


def test_bf16_on_mps_needs_macos_14(monkeypatch) -> None:
    asked = []

    def fake_is_macos_or_newer(major: int, minor: int) -> bool:
        asked.append((major, minor))
        return False

    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", fake_is_macos_or_newer)
    assert not recipes.bf16_is_fast(torch.device("mps"))
    assert "bf16_autocast" not in recipes.recipes_for(torch.device("mps"))
    assert asked and all(v == (14, 0) for v in asked)


def test_tf32_advice_is_ignored_and_nothing_else() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with recipes.tf32_advice_ignored():
            for message in recipes.TF32_ADVICE:
                warnings.warn(message + " (as torch words it)", UserWarning, stacklevel=1)
            warnings.warn("another warning", UserWarning, stacklevel=1)
            warnings.warn(recipes.TF32_ADVICE[0], DeprecationWarning, stacklevel=1)
        warnings.warn(recipes.TF32_ADVICE[0], UserWarning, stacklevel=1)  # outside the block
    seen = [(w.category, str(w.message)) for w in caught]
    assert seen == [(UserWarning, "another warning"), (DeprecationWarning, recipes.TF32_ADVICE[0]),
                    (UserWarning, recipes.TF32_ADVICE[0])]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("recipe", recipes.recipes_for(torch.device("cpu")) + [
    "fp16_autocast_gradscaler", "cudnn_benchmark", "plain_host_copy", "pinned_non_blocking",
    "compile"])
def test_each_cuda_step_trains(recipe: str) -> None:
    """Every recipe the benchmark measures on this GPU runs and lowers the loss on one batch."""
    device = torch.device("cuda", torch.cuda.current_device())
    if recipe not in recipes.recipes_for(device):
        pytest.skip(f"{recipe} is not measured on {torch.cuda.get_device_name(device)}")
    step = recipes.make_step(recipe, device, batch_size=64)
    with recipes.tf32_advice_ignored():
        losses = [step().item() for _ in range(8)]
    assert all(math.isfinite(v) for v in losses), losses
    assert losses[-1] < losses[0], f"{recipe}: eight steps on one batch should lower the loss"
    assert (step.recipe_step.scaler is not None) is (recipe == "fp16_autocast_gradscaler")


@pytest.mark.parametrize(("kind", "batch"), [("cpu", recipes.BATCH_SIZE),
                                             ("cuda", recipes.GPU_BATCH_SIZE)])
def test_the_benchmark_times_what_chapter_12_says_it_times(monkeypatch, kind, batch) -> None:
    """Chapter 12's dropdown on the appendix's figures: the benchmark's full run times the same
    steps (make_step, a synthetic batch) at the library's batch size, 0.5 s per recipe, one
    recipe after the other; then the residual CNN at its size for the device, 0.005 s per
    recipe (five blocks of one step on a GPU), without the input-pipeline recipes; on CUDA
    the GPU's busy time of both plain steps."""
    from types import SimpleNamespace

    from bench import recipes as bench_recipes

    made, timed, busy = [], [], []

    def fake_make_step(recipe, device, batch_size, **model):
        made.append((recipe, torch.device(device).type, batch_size, model))
        return lambda: None

    def fake_benchmark(fn, *, device, label, warmup, min_run_time):
        timed.append((label, min_run_time))
        return SimpleNamespace(median=1e-3, iqr=1e-5)

    def fake_busy(fn, device):
        busy.append(torch.device(device).type)
        return recipes.DeviceBusy(steps=10, busy_ms=0.5, operations=40.0)

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(bench_recipes, "make_step", fake_make_step)
    monkeypatch.setattr(bench_recipes, "benchmark", fake_benchmark)
    monkeypatch.setattr(bench_recipes, "device_busy", fake_busy)
    monkeypatch.setattr(bench_recipes, "synchronize", lambda device: None)
    figures = bench_recipes.run(torch.device(kind), quick=False)
    names = recipes.recipes_for(torch.device(kind))
    res_names = [n for n in names if n not in ("plain_host_copy", "pinned_non_blocking")]
    width, res_batch = recipes.resnet_size(kind)
    assert (width, res_batch) == (recipes.RESNET_GPU_SIZE if kind == "cuda"
                                  else recipes.RESNET_SMALL_SIZE)
    res_model = {"model": "resnet", "width": width}
    expected = ([(name, kind, batch, {}) for name in names]
                + [(name, kind, res_batch, res_model) for name in res_names])
    if kind == "cuda":
        expected += [("plain", kind, batch, {}), ("plain", kind, res_batch, res_model)]
    assert made == expected
    assert timed == [(name, 0.5) for name in names] + [(name, 0.005) for name in res_names]
    got = {f.name: f for f in figures}
    assert set(got) >= {f"{name}_speedup" for name in names}
    assert set(got) >= {f"resnet_{name}_speedup" for name in res_names}
    assert not {"resnet_plain_host_copy_speedup", "resnet_pinned_non_blocking_speedup"} & set(got)
    assert ("resnet_compile_seconds" in got) is (kind == "cuda")
    if kind == "cuda":
        assert busy == ["cuda", "cuda"]
        assert got["plain_gpu_busy_ms"].value == got["resnet_plain_gpu_busy_ms"].value == 0.5
        assert f"batch {res_batch}" in got["resnet_plain_gpu_busy_ms"].note
    else:
        assert busy == [] and "plain_gpu_busy_ms" not in got


def test_a_gpu_the_profiler_cannot_see_loses_only_the_busy_figure(monkeypatch, capsys) -> None:
    """Without CUPTI a profile holds none of the GPU's work (helpers.recipes raises
    NoGpuWorkProfiled): the benchmark leaves that figure out, says why, and keeps the others."""
    from types import SimpleNamespace

    from bench import recipes as bench_recipes

    def no_gpu_work(fn, device):
        raise recipes.NoGpuWorkProfiled("the profiler recorded no GPU work on cuda:0")

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(bench_recipes, "make_step", lambda *a, **k: (lambda: None))
    monkeypatch.setattr(bench_recipes, "benchmark",
                        lambda fn, **k: SimpleNamespace(median=1e-3, iqr=1e-5))
    monkeypatch.setattr(bench_recipes, "device_busy", no_gpu_work)
    monkeypatch.setattr(bench_recipes, "synchronize", lambda device: None)
    got = {f.name for f in bench_recipes.run(torch.device("cuda"), quick=False)}
    assert "plain_speedup" in got and "resnet_compile_seconds" in got
    assert not {"plain_gpu_busy_ms", "resnet_plain_gpu_busy_ms"} & got
    err = capsys.readouterr().err
    assert "plain_gpu_busy_ms left out: the profiler recorded no GPU work" in err


def test_the_residual_cnn_maps_images_to_logits_at_any_width() -> None:
    torch.manual_seed(0)
    for width in (4, 16):
        model = recipes.ResidualCNN(width=width)
        assert model(torch.rand(3, 1, 28, 28)).shape == (3, 10)
        convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
        # the stem, two blocks of two and the stride-2 convolution: six 3x3 convolutions
        assert len(convs) == 6 and all(c.kernel_size == (3, 3) for c in convs)
        assert convs[-1].out_channels == 2 * width
    with pytest.raises(ValueError, match="width"):
        recipes.ResidualCNN(width=0)


def test_resnet_sizes_are_the_documented_ones(monkeypatch) -> None:
    assert recipes.resnet_size("cpu") == recipes.RESNET_SMALL_SIZE == (16, 16)
    assert recipes.resnet_size("cuda:1") == recipes.RESNET_GPU_SIZE == (64, 1024)
    assert recipes.resnet_size("cuda:0", quick=True) == recipes.RESNET_SMALL_SIZE
    assert 512 <= recipes.RESNET_GPU_SIZE[1] <= 1024  # issue 28: a batch of 512 to 1024


@pytest.mark.parametrize("recipe", ["plain", "channels_last"])
def test_each_cpu_resnet_step_trains(recipe: str) -> None:
    step = recipes.make_step(recipe, torch.device("cpu"), batch_size=8, model="resnet",
                             width=8)
    assert isinstance(step.recipe_step.model, recipes.ResidualCNN)
    losses = [step().item() for _ in range(5)]
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0], f"{recipe}: five steps on one batch should lower the loss"
    if recipe == "channels_last":
        conv = step.recipe_step.model.block1[0][0]
        assert conv.weight.is_contiguous(memory_format=torch.channels_last)


def test_models_and_widths_are_checked() -> None:
    with pytest.raises(ValueError, match="model must be one of"):
        recipes.RecipeStep("plain", "cpu", model="vgg")
    with pytest.raises(ValueError, match="width"):
        recipes.RecipeStep("plain", "cpu", width=16)  # the chapter 5 CNN has no width
    step = recipes.RecipeStep("plain", "cpu", model="resnet", width=4)
    assert step.model_name == "resnet" and step.model.head[-1].in_features == 8
