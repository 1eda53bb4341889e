"""Bad input for every public function of helpers.regression (chapter 4), as a reader would pass
it from the signatures and docstrings: each case ends in a clear error that names the bad value
and says what to do, or in a correct result."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from helpers import regression
from helpers.models import LinearRegression
from tests.support import assert_clear_error

N = 64


def _data(n: int = N, dtype: torch.dtype = torch.float32):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=gen, dtype=dtype)
    y = x @ torch.tensor([[2.0], [-3.0]], dtype=dtype) + 10
    return x, y


X, Y = _data()


def fit(x=X, y=Y, **kwargs):
    return regression.fit_regression(x, y, **{"steps": 3, **kwargs})


ERRORS = [
    ("x as a numpy array", lambda: fit(x=X.numpy()), TypeError,
     ["ndarray", "torch.as_tensor(x"]),
    ("y as a list", lambda: fit(y=Y.ravel().tolist()), TypeError, ["list", "torch.as_tensor(y"]),
    ("integer x", lambda: fit(x=X.long()), TypeError, ["torch.int64", "x.float()"]),
    ("boolean y", lambda: fit(y=Y > 0), TypeError, ["torch.bool", "y.float()"]),
    ("x of one dimension", lambda: fit(x=X[:, 0], y=Y), ValueError,
     ["(64,)", "x.reshape(-1, 1)"]),
    ("x with no rows", lambda: fit(x=X[:0], y=Y[:0]), ValueError, ["(0, 2)"]),
    ("x with no columns", lambda: fit(x=X[:, :0]), ValueError, ["(64, 0)"]),
    ("a 1-D target (the chapter's broadcasting bug)", lambda: fit(y=Y.ravel()), ValueError,
     ["(64,)", "y.reshape(-1, 1)", "[n, n]"]),
    ("fewer targets than rows", lambda: fit(y=Y[:10]), ValueError, ["(10, 1)", "64 rows"]),
    ("two targets per row", lambda: fit(y=torch.cat([Y, Y], 1)), ValueError, ["(64, 2)"]),
    ("x and y of different dtypes", lambda: fit(y=Y.double()), TypeError,
     ["torch.float32", "torch.float64", "y.to(x.dtype)"]),
    ("x and y on different devices", lambda: fit(x=X.to("meta")), ValueError,
     ["meta", "cpu", "move both to one device"]),
    ("both on meta", lambda: fit(x=X.to("meta"), y=Y.to("meta")), ValueError,
     ["meta", "'cpu'"]),
    ("zero steps", lambda: fit(steps=0), ValueError, ["steps", "0"]),
    ("fractional steps", lambda: fit(steps=2.5), ValueError, ["steps", "2.5"]),
    ("steps as text", lambda: fit(steps="500"), ValueError, ["steps", "'500'"]),
    ("a negative learning rate", lambda: fit(lr=-0.1), ValueError, ["lr", "-0.1"]),
    ("a zero learning rate", lambda: fit(lr=0), ValueError, ["lr", "0"]),
    ("a NaN learning rate", lambda: fit(lr=math.nan), ValueError, ["lr", "nan"]),
    ("a learning rate as text", lambda: fit(lr="0.1"), ValueError, ["lr", "'0.1'"]),
    ("a negative seed", lambda: fit(seed=-1), ValueError, ["seed", "-1"]),
    ("a train step with a 1-D target",
     lambda: regression.regression_step(*_step_parts(), X, Y.ravel()), ValueError,
     ["(64, 1)", "(64,)", "y.reshape(-1, 1)"]),
]


def _step_parts():
    model = LinearRegression()
    return model, torch.optim.Adam(model.parameters(), lr=0.1), nn.MSELoss()


@pytest.mark.parametrize(("call", "error", "words"), [c[1:] for c in ERRORS],
                         ids=[c[0] for c in ERRORS])
def test_bad_input_gets_a_clear_error(call, error, words) -> None:
    assert_clear_error(call, error, words)


def test_a_refused_regression_step_leaves_the_model_as_it_was() -> None:
    model, optimizer, loss_fn = _step_parts()
    assert_clear_error(lambda: regression.regression_step(model, optimizer, loss_fn, X, Y.ravel()),
                       ValueError, [], model=model)


X64, Y64 = X.double(), Y.double()

RESULTS = [
    ("float64 data: the model is made in float64", lambda: fit(x=X64, y=Y64, steps=5),
     lambda r: r.losses.dtype == torch.float64 and len(r.losses) == 5),
    ("one step", lambda: fit(steps=1), lambda r: r.losses.shape == (1,)),
    ("numpy whole numbers for steps and seed", lambda: fit(steps=np.int64(2), seed=np.int32(1)),
     lambda r: r.losses.shape == (2,)),
    ("a whole-number learning rate", lambda: fit(lr=1), lambda r: math.isfinite(r.final_loss)),
    ("one feature", lambda: fit(x=X[:, :1]), lambda r: len(r.w) == 1),
    ("one row", lambda: fit(x=X[:1], y=Y[:1]), lambda r: math.isfinite(r.final_loss)),
    ("non-contiguous x", lambda: fit(x=torch.randn(2, N).T, y=Y),
     lambda r: math.isfinite(r.final_loss)),
    ("logging every step", lambda: fit(log_every_step=True),
     lambda r: r.log_every_step and r.losses.shape == (3,)),
    ("a step with a matching target",
     lambda: regression.regression_step(*_step_parts(), X, Y),
     lambda r: r.shape == () and r.requires_grad),
]


@pytest.mark.parametrize(("call", "check"), [c[1:] for c in RESULTS], ids=[c[0] for c in RESULTS])
def test_unusual_but_meaningful_input_gets_a_correct_result(call, check) -> None:
    assert check(call())


def test_float64_and_float32_fits_agree() -> None:
    single, double = fit(steps=50), fit(x=X64, y=Y64, steps=50)
    torch.testing.assert_close(double.losses.float(), single.losses, rtol=1e-4, atol=1e-4)
