"""helpers.recipes.compile_or_explain: what torch.compile really raises when its compiler
cannot work on a machine, caught with advice, and nothing else caught (chapters 11 and 12)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed
from torch._inductor.exc import (
    CppCompileError,
    GPUTooOldForTriton,
    InductorError,
    InvalidCxxCompiler,
    TritonMissing,
)

from helpers.recipes import CompileOutcome, compile_advice, compile_failures, compile_or_explain
from tests.support import assert_mentions


def _inductor():  # stands for the backend function BackendCompilerFailed names
    pass


OLD_GPU = SimpleNamespace(name="Tesla K80", major=3, minor=7)

#: (what torch raises, the device, words the advice must contain)
CASES = {
    "triton missing (unwrapped)": (TritonMissing(None), "cpu", ["pip install triton"]),
    "gpu too old (unwrapped)": (GPUTooOldForTriton(OLD_GPU, None), "cpu",
                                ["compute capability 7.0", "without torch.compile"]),
    "no C++ compiler (InductorError)": (InductorError(InvalidCxxCompiler(), None), "cpu",
                                        ["C++ compiler", "g++"]),
    "C++ compile error (BackendCompilerFailed)": (
        BackendCompilerFailed(_inductor, CppCompileError(["g++", "k.cpp"], "k.cpp:1: error"),
                              None), "cpu", ["C++ compiler"]),
    "another backend failure": (BackendCompilerFailed(_inductor, RuntimeError("boom"), None),
                                "cpu", ["TORCHDYNAMO_VERBOSE=1", "boom"]),
}


def test_triton_errors_are_not_backend_compiler_failed() -> None:
    # Why catching BackendCompilerFailed alone is not enough in torch 2.14.
    assert not issubclass(TritonMissing, BackendCompilerFailed)
    assert not issubclass(GPUTooOldForTriton, BackendCompilerFailed)
    assert {TritonMissing, GPUTooOldForTriton, BackendCompilerFailed} <= set(compile_failures())


@pytest.mark.parametrize("case", list(CASES))
def test_each_failure_is_caught_with_its_advice(case: str, capsys) -> None:
    exc, device, words = CASES[case]
    with compile_or_explain(device) as outcome:
        raise exc
    assert isinstance(outcome, CompileOutcome) and not outcome.ok
    assert outcome.error is exc
    printed = capsys.readouterr().out
    assert printed.strip() == outcome.advice
    assert outcome.advice.startswith("torch.compile could not compile for cpu")
    assert "What to do:" in outcome.advice
    assert_mentions(outcome.advice, words)
    assert "\n" not in outcome.advice and len(outcome.advice) < 600


def test_a_block_that_compiles_is_ok(capsys) -> None:
    with compile_or_explain("cpu") as outcome:
        pass
    assert outcome.ok and outcome.advice is None and capsys.readouterr().out == ""


@pytest.mark.parametrize("error", [ValueError("not a compiler problem"),
                                   RuntimeError("shape mismatch"), KeyboardInterrupt()])
def test_other_errors_propagate(error: BaseException) -> None:
    with pytest.raises(type(error)):
        with compile_or_explain("cpu"):
            raise error


def test_compile_advice_refuses_other_exceptions() -> None:
    with pytest.raises(TypeError, match="not ValueError"):
        compile_advice(ValueError("x"), "cpu")


def test_a_real_missing_cpp_compiler_is_explained(capsys) -> None:
    # The real path, not a fake: inductor searches config.cpp.cxx for a compiler, finds none,
    # raises InvalidCxxCompiler, and compile_fx wraps it in InductorError.
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 3.25 + 0.125

    torch._dynamo.reset()
    with torch._inductor.config.patch({"cpp.cxx": (None, "no-such-cxx-for-the-book"),
                                       "fx_graph_cache": False}):
        with compile_or_explain("cpu") as outcome:
            torch.compile(f)(torch.randn(8))
    torch._dynamo.reset()
    assert not outcome.ok
    assert isinstance(outcome.error, BackendCompilerFailed)
    assert isinstance(outcome.error.inner_exception, InvalidCxxCompiler)
    assert "C++ compiler" in capsys.readouterr().out
