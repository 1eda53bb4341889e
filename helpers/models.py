"""The book's models, kept small so every chapter trains them in seconds to minutes.

``MnistCNN`` is introduced in chapter 5 (MNIST, CPU vs GPU), ``LinearRegression`` in chapter 4
(Linear regression, CPU vs GPU) and ``SequenceClassifier`` in chapter 8 (Device pitfalls),
where its buggy ancestor from the anonymous notes *Pytorch GPU 训练* is taken apart first.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LinearRegression", "MnistCNN", "SequenceClassifier", "count_parameters"]


class MnistCNN(nn.Module):
    """The MNIST CNN of Wang Zhefeng's tutorial *PyTorch 训练模型 GPU* (chapter 5): two convolutions and a small head.

    conv 1->32 (k3), max-pool 2, conv 32->64 (k5), max-pool 2, Dropout2d(0.1),
    adaptive max-pool to 1x1, flatten, linear 64->32, ReLU, linear 32->10. Takes images of
    shape ``[N, 1, 28, 28]`` and returns logits ``[N, 10]``.
    """

    def __init__(self, dropout: float = 0.1) -> None:
        if isinstance(dropout, bool) or not isinstance(dropout, int | float) \
                or not 0 <= dropout < 1:
            raise ValueError(f"dropout is the probability of zeroing a channel, a number in "
                             f"[0, 1), got {dropout!r}")
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(1, 32, kernel_size=3),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=5),
            nn.MaxPool2d(2),
            nn.Dropout2d(p=dropout),
            nn.AdaptiveMaxPool2d((1, 1)),
            nn.Flatten(),
            nn.Linear(64, 32),
            nn.ReLU(),
            nn.Linear(32, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != 1:
            raise ValueError(f"MnistCNN takes greyscale images [N, 1, H, W], got "
                             f"{tuple(x.shape)}: add the channel dimension with "
                             "x.unsqueeze(1), or stack single images into a batch")
        return self.layers(x)


class LinearRegression(nn.Module):
    """``y = x @ w.T + b`` with ``w`` of shape ``[1, d]`` and ``b`` of shape ``[1]`` (chapter 4).

    Parameters start from a seeded normal draw (``w``) and zero (``b``), as in both of
    chapter 4's tutorials (Wang Zhefeng's *PyTorch 训练模型 GPU* and lyhue1991's *6-3,
    使用GPU训练模型*), so CPU and GPU runs start from the same point.
    """

    def __init__(self, n_features: int = 2, seed: int = 0) -> None:
        _positive("n_features", n_features)
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.w = nn.Parameter(torch.randn(1, n_features, generator=gen))
        self.b = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 2 or x.shape[1] != self.w.shape[1]:
            raise ValueError(f"LinearRegression({self.w.shape[1]}) takes x of shape [n, "
                             f"{self.w.shape[1]}], got {tuple(x.shape)}")
        return x @ self.w.T + self.b


class SequenceClassifier(nn.Module):
    """An RNN that classifies a sequence from its last hidden state (chapter 8).

    The corrected version of the ``SimpleRNN`` of *Pytorch GPU 训练*: the initial hidden state
    is made with ``x.new_zeros``, so it follows the input's device and dtype wherever the
    model is moved, and ``squeeze(0)`` drops the layer dimension (the source squeezed
    dimension 1, which only works for a batch of one). Input ``[seq_len, batch, input_dim]``,
    output ``[batch, output_dim]``.
    """

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int) -> None:
        for name, value in (("input_dim", input_dim), ("hidden_dim", hidden_dim),
                            ("output_dim", output_dim)):
            _positive(name, value)
        super().__init__()
        self.hidden_dim = hidden_dim
        self.rnn = nn.RNN(input_dim, hidden_dim)
        self.fc = nn.Linear(hidden_dim, output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 3 or x.shape[2] != self.rnn.input_size:
            raise ValueError(f"SequenceClassifier takes x of shape [seq_len, batch, "
                             f"{self.rnn.input_size}], got {tuple(x.shape)}")
        hidden = x.new_zeros(1, x.shape[1], self.hidden_dim)
        _, hidden = self.rnn(x, hidden)
        return self.fc(hidden.squeeze(0))


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive whole number, got {value!r}")


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of (trainable) parameters of ``model`` (chapter 5)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"count_parameters takes an nn.Module, got {type(model).__name__}")
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
