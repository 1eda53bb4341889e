"""Bad input for every public function and class of helpers.recipes (chapter 12), called as a
reader who has read only the signatures and docstrings would call them. Each case ends in a
clear error naming the bad value (and what to do), or in a correct result."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.recipes import (
    BATCH_SIZE,
    RecipeStep,
    bf16_is_fast,
    compile_advice,
    compile_or_explain,
    make_step,
    recipes_for,
)
from tests.support import assert_clear_error

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")

def _enter_compile_or_explain(device):
    return compile_or_explain(device).__enter__()


#: (device as a user might pass it, exception, words the message must contain)
BAD_DEVICES = [
    pytest.param("gpu", ValueError, ["'gpu'", "cuda"], id="gpu-is-no-device-type"),
    pytest.param("CPU", ValueError, ["'CPU'", "'cpu'"], id="upper-case"),
    pytest.param("meta", ValueError, ["meta", "'cpu'"], id="meta-computes-nothing"),
    pytest.param("cuda:99", ValueError, ["cuda:99"], id="gpu-index-that-does-not-exist"),
    pytest.param(None, (TypeError, ValueError), ["None"], id="none"),
    pytest.param("cuda", ValueError, ["'cuda'", "not available"], id="cuda-without-a-gpu",
                 marks=NO_CUDA),
]


@pytest.mark.parametrize("device, error, words", BAD_DEVICES)
@pytest.mark.parametrize("call", [recipes_for, bf16_is_fast,
                                  lambda d: RecipeStep("plain", d),
                                  lambda d: make_step("plain", d),
                                  _enter_compile_or_explain],
                         ids=["recipes_for", "bf16_is_fast", "RecipeStep", "make_step",
                              "compile_or_explain"])
def test_bad_devices(call, device, error, words) -> None:
    if call is _enter_compile_or_explain and device == "meta":
        assert call(device).ok  # compiling for meta (shapes only) is legitimate
        return
    assert_clear_error(lambda: call(device), error, words)


@pytest.mark.parametrize("device", ["cpu", " cpu ", torch.device("cpu")])
def test_cpu_spellings_give_the_cpu_recipes(device) -> None:
    assert recipes_for(device) == ["plain", "bf16_autocast", "channels_last"]
    assert bf16_is_fast(device) is True


#: (arguments of RecipeStep, words the ValueError must contain)
BAD_RECIPE_STEPS = {
    "unknown recipe": (("turbo", "cpu"), {}, ["'turbo'", "choose from", "plain"]),
    "misspelt recipe": (("channel_last", "cpu"), {}, ["'channel_last'", "channels_last"]),
    "cuda recipe on the cpu": (("fp16_autocast_gradscaler", "cpu"), {},
                               ["'fp16_autocast_gradscaler'", "does not apply to cpu"]),
    "recipe as None": ((None, "cpu"), {}, ["None", "choose from"]),
    "learning rate 0": (("plain", "cpu"), {"lr": 0}, ["lr", "0"]),
    "negative learning rate": (("plain", "cpu"), {"lr": -1e-3}, ["lr", "-0.001"]),
    "NaN learning rate": (("plain", "cpu"), {"lr": math.nan}, ["lr", "nan"]),
    "learning rate as text": (("plain", "cpu"), {"lr": "1e-3"}, ["lr", "'1e-3'"]),
    "negative seed": (("plain", "cpu"), {"seed": -1}, ["seed", "-1"]),
    "fractional seed": (("plain", "cpu"), {"seed": 1.5}, ["seed", "1.5"]),
}


@pytest.mark.parametrize("case", list(BAD_RECIPE_STEPS))
def test_bad_recipe_steps(case: str) -> None:
    args, kwargs, words = BAD_RECIPE_STEPS[case]
    assert_clear_error(lambda: RecipeStep(*args, **kwargs), ValueError, words)


@pytest.fixture(scope="module")
def step() -> RecipeStep:
    return RecipeStep("plain", "cpu")


def _batch(n: int = 8):
    return torch.rand(n, 1, 28, 28), torch.randint(0, 10, (n,))


#: (images, labels) a user might pass to a step, exception, words the message must contain
BAD_BATCHES = {
    "images as a list": (lambda: ([[0.0]], _batch()[1]), TypeError, ["list"]),
    "no channel dimension": (lambda: (torch.rand(8, 28, 28), _batch()[1]), ValueError,
                             ["(8, 28, 28)", "unsqueeze(1)"]),
    "flattened images": (lambda: (torch.rand(8, 784), _batch()[1]), ValueError, ["(8, 784)"]),
    "wrong image size": (lambda: (torch.rand(8, 1, 32, 32), _batch()[1]), ValueError,
                         ["(8, 1, 32, 32)"]),
    "float labels": (lambda: (_batch()[0], torch.rand(8)), ValueError,
                     ["torch.float32", "y.long()"]),
    "one-hot labels": (lambda: (_batch()[0], torch.eye(10)[:8]), ValueError, ["(8, 10)"]),
    "fewer labels than images": (lambda: (_batch()[0], torch.randint(0, 10, (4,))),
                                 ValueError, ["(4,)", "(8,)"]),
    "images on another device": (lambda: (_batch()[0].to("meta"), _batch()[1]), ValueError,
                                 ["meta", "cpu", ".to(step.device)"]),
}


@pytest.mark.parametrize("case", list(BAD_BATCHES))
def test_bad_batches(step: RecipeStep, case: str) -> None:
    make, error, words = BAD_BATCHES[case]
    # Nothing half-done: a refused batch leaves the weights untouched.
    assert_clear_error(lambda: step(*make()), error, words, model=step.model)


def test_a_good_batch_trains(step: RecipeStep) -> None:
    loss = step(*_batch())
    assert loss.shape == () and math.isfinite(loss.item())


@pytest.mark.parametrize("batch_size", [0, -4, 2.5, True, "128"])
def test_bad_batch_sizes(batch_size) -> None:
    assert_clear_error(lambda: make_step("plain", "cpu", batch_size), ValueError,
                       ["batch_size", repr(batch_size)])


def test_batch_size_one_is_a_correct_step() -> None:
    assert math.isfinite(make_step("plain", "cpu", 1)().item())
    assert BATCH_SIZE == 128


@pytest.mark.parametrize("exc", [ValueError("x"), KeyError("k"), "not an exception"])
def test_compile_advice_explains_only_compiler_failures(exc) -> None:
    with pytest.raises(TypeError, match="compiler failures"):
        compile_advice(exc, "cpu")
