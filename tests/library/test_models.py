import torch

from helpers.models import LinearRegression, MnistCNN, SequenceClassifier, count_parameters


def test_mnist_cnn_matches_the_source_architecture():
    net = MnistCNN()
    kinds = [type(m).__name__ for m in net.layers]
    assert kinds == ["Conv2d", "MaxPool2d", "Conv2d", "MaxPool2d", "Dropout2d",
                     "AdaptiveMaxPool2d", "Flatten", "Linear", "ReLU", "Linear"]
    assert net.layers[0].in_channels == 1 and net.layers[0].out_channels == 32
    assert net.layers[2].kernel_size == (5, 5) and net.layers[2].out_channels == 64
    assert net(torch.zeros(4, 1, 28, 28)).shape == (4, 10)
    assert count_parameters(net) == 320 + 51_264 + 2_080 + 330


def test_linear_regression_shapes_and_seed():
    model = LinearRegression(2, seed=0)
    assert model(torch.zeros(5, 2)).shape == (5, 1)
    assert torch.equal(model.w, LinearRegression(2, seed=0).w)
    assert torch.equal(model.b, torch.zeros(1))


def test_sequence_classifier_follows_its_input():
    model = SequenceClassifier(10, 5, 3)
    x = torch.randn(4, 7, 10)  # seq_len 4, batch 7
    assert model(x).shape == (7, 3)
    assert model(torch.randn(4, 1, 10)).shape == (1, 3)
    model.to(torch.float64)
    assert model(torch.randn(4, 2, 10, dtype=torch.float64)).dtype == torch.float64
    model.to("meta")
    assert model(x.to("meta", torch.float64)).device.type == "meta"
