"""Bad input for helpers.models (chapters 4, 5, 8): each case ends in an error that names
the bad value and what to do, or a correct result."""

from __future__ import annotations

import pytest
import torch

from helpers.models import LinearRegression, MnistCNN, SequenceClassifier, count_parameters
from tests.support import assert_clear_error


@pytest.mark.parametrize("make,error,words", [
    (lambda: MnistCNN(dropout=2), ValueError, ["dropout", "2"]),
    (lambda: MnistCNN(dropout="0.1"), ValueError, ["'0.1'"]),
    (lambda: MnistCNN()(torch.zeros(2, 3, 28, 28)), ValueError, ["(2, 3, 28, 28)"]),
    (lambda: MnistCNN()(torch.zeros(2, 28, 28)), ValueError, ["unsqueeze(1)"]),
    (lambda: LinearRegression(0), ValueError, ["n_features", "0"]),
    (lambda: LinearRegression(-1), ValueError, ["-1"]),
    (lambda: LinearRegression(2)(torch.zeros(4, 3)), ValueError, ["[n, 2]", "(4, 3)"]),
    (lambda: SequenceClassifier(0, 4, 2), ValueError, ["input_dim"]),
    (lambda: SequenceClassifier(3, 4, 0), ValueError, ["output_dim"]),
    (lambda: SequenceClassifier(3, 4, 2)(torch.zeros(5, 2)), ValueError, ["(5, 2)"]),
    (lambda: SequenceClassifier(3, 4, 2)(torch.zeros(5, 2, 4)), ValueError, ["3]"]),
    (lambda: count_parameters([torch.zeros(3)]), TypeError, ["nn.Module", "list"]),
])
def test_bad_input_is_named(make, error, words):
    assert_clear_error(make, error, words)


def test_odd_but_valid_input_gives_a_correct_result():
    assert MnistCNN(dropout=0)(torch.zeros(1, 1, 40, 40)).shape == (1, 10)
    assert LinearRegression(1)(torch.zeros(3, 1)).shape == (3, 1)
    assert SequenceClassifier(3, 4, 2)(torch.zeros(1, 1, 3)).shape == (1, 2)
    frozen = MnistCNN()
    for p in frozen.parameters():
        p.requires_grad_(False)
    assert count_parameters(frozen) == 0 and count_parameters(frozen, trainable_only=False) > 0
