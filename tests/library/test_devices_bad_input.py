"""Bad input for every public function of helpers.devices, as a user would pass it.

Each case is written from the function's signature and docstring and ends either in a clear
error that names the bad value and says what to do, or in a correct result.
"""

import pytest
import torch
from torch import nn

from helpers import devices
from helpers.devices import (
    DEVICE_ENV_VAR,
    DeviceMismatchError,
    available_devices,
    best_device,
    check_same_device,
    describe_devices,
    device_of,
    module_device,
    resolve_device,
)
from tests.support import assert_clear_error

GPUS = torch.cuda.device_count()
MISSING_CUDA = f"cuda:{GPUS}"  # never exists: GPUs are numbered from 0
HAS_MPS = devices._type_available("mps")

# (spec, exception, words the message must contain); every ValueError also lists the devices.
RESOLVE_BAD = [
    ("gpu", ValueError, ["'gpu'", "did you mean"]),
    ("GPU:0", ValueError, ["'GPU:0'", "did you mean"]),
    ("CUDA", ValueError, ["'CUDA'", "did you mean 'cuda'"]),
    ("Cpu", ValueError, ["'Cpu'", "did you mean 'cpu'"]),
    ("banana", ValueError, ["'banana'"]),
    ("", ValueError, ["empty"]),
    ("   ", ValueError, ["empty"]),
    ("cuda:-1", ValueError, ["'cuda:-1'"]),
    ("cuda: 0", ValueError, ["'cuda: 0'"]),
    ("cuda:0:1", ValueError, ["'cuda:0:1'"]),
    ("cuda:x", ValueError, ["'cuda:x'"]),
    (MISSING_CUDA, ValueError, [repr(MISSING_CUDA), "does not exist" if GPUS else "not available"]),
    ("cuda:7", ValueError, ["'cuda:7'"]),
    ("mps:1", ValueError, ["'mps:1'"]),
    ("cpu:1", ValueError, ["'cpu:1'", "one CPU device"]),
    ("xla", ValueError, ["'xla'", "not supported"]),
    (-1, ValueError, ["-1", "numbered from 0"]),
    (GPUS, ValueError, [f"cuda:{GPUS}"]),
    (torch.device("cuda", 7), ValueError, ["'cuda:7'"]),
    (None, TypeError, ["None", "NoneType"]),
    (3.5, TypeError, ["3.5", "float"]),
    (True, TypeError, ["True", "bool"]),
    (["cuda"], TypeError, ["['cuda']", "list"]),
    (b"cuda", TypeError, ["b'cuda'", "bytes"]),
]
if not torch.cuda.is_available():
    RESOLVE_BAD += [("cuda", ValueError, ["'cuda'", "not available"])]
if not HAS_MPS:
    RESOLVE_BAD += [("mps", ValueError, ["'mps'", "not available"])]


@pytest.mark.parametrize(("spec", "error", "words"), RESOLVE_BAD, ids=repr)
def test_resolve_device_refuses_what_does_not_exist(spec, error, words):
    # What to do: the devices that do exist.
    assert_clear_error(lambda: resolve_device(spec), error,
                       [*words, "Devices on this machine: ", "cpu"])


RESOLVE_GOOD = [
    ("cpu", torch.device("cpu")),
    ("cpu:0", torch.device("cpu")),  # CPU tensors report "cpu", without an index
    (" cpu ", torch.device("cpu")),
    (torch.device("cpu"), torch.device("cpu")),
    ("meta", torch.device("meta")),
    ("meta:0", torch.device("meta")),  # meta tensors report "meta"
]


@pytest.mark.parametrize(("spec", "expected"), RESOLVE_GOOD, ids=repr)
def test_resolve_device_gives_what_tensors_report(spec, expected):
    resolved = resolve_device(spec)
    assert resolved == expected
    assert torch.empty(0, device=resolved).device == resolved


@pytest.mark.parametrize("value", ["gpu", "cuda:7", "mps:1", "banana", "cpu:1", "CUDA"])
def test_bad_environment_variable_is_named_with_the_fix(value, monkeypatch):
    monkeypatch.setenv(DEVICE_ENV_VAR, value)
    with pytest.raises(ValueError) as err:
        best_device()
    message = str(err.value)
    assert f"${DEVICE_ENV_VAR}={value!r}" in message
    assert f"Fix or unset {DEVICE_ENV_VAR}" in message and "Devices on this machine" in message


@pytest.mark.parametrize("value", ["", "   ", "\t"])
def test_blank_environment_variable_counts_as_unset(value, monkeypatch):
    monkeypatch.setenv(DEVICE_ENV_VAR, value)
    assert best_device() == torch.device(available_devices()[0])


def test_environment_variable_with_spaces_around_a_good_value(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV_VAR, " cpu ")
    assert best_device() == torch.device("cpu")


# (override, exception, words the message must contain)
OVERRIDE_BAD = [
    (3.5, TypeError, ["3.5"]),
    ([0], TypeError, ["[0]"]),
    ("gpu", ValueError, ["'gpu'", "did you mean"]),
    ("cuda:7", ValueError, ["'cuda:7'"]),
    ("meta", ValueError, ["meta", "no data"]),
    (-1, ValueError, ["-1"]),
    (GPUS + 3, ValueError, [f"cuda:{GPUS + 3}", "Devices on this machine"]),
]


@pytest.mark.parametrize(("override", "error", "words"), OVERRIDE_BAD, ids=repr)
def test_best_device_override_errors_do_not_blame_the_environment(override, error, words,
                                                                  monkeypatch):
    monkeypatch.setenv(DEVICE_ENV_VAR, "cpu")
    err = assert_clear_error(lambda: best_device(override), error, words)
    assert DEVICE_ENV_VAR not in str(err)


@pytest.mark.parametrize(("bad", "words"),
                         [(torch.ones(2), ["Tensor", ".device"]), (None, ["NoneType"]),
                          ("cpu", ["str"]), ([nn.Linear(1, 1)], ["list"])], ids=repr)
def test_module_device_needs_a_module(bad, words):
    assert_clear_error(lambda: module_device(bad), TypeError, ["nn.Module", *words])


def test_module_device_without_tensors_and_split_across_devices():
    with pytest.raises(ValueError, match="ReLU has no parameters or buffers"):
        module_device(nn.ReLU())
    split = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).to("meta"))
    with pytest.raises(DeviceMismatchError, match=r"'0.weight' on cpu, '1.weight' on meta"):
        module_device(split)


@pytest.mark.parametrize("obj", [None, 3, "cuda", [torch.ones(1)], nn.ReLU()], ids=repr)
def test_device_of_anything_else_is_none(obj):
    assert device_of(obj) is None


@pytest.mark.parametrize(("args", "named"), [((), {}), ((None, 3), {}), ((1, "a"), {}),
                                             ((nn.ReLU(),), {}), ((), {"act": nn.ReLU()})],
                         ids=repr)
def test_check_same_device_needs_a_tensor(args, named):
    with pytest.raises(ValueError, match="at least one tensor"):
        check_same_device(*args, **named)


def test_check_same_device_names_each_object():
    with pytest.raises(DeviceMismatchError) as err:
        check_same_device(torch.ones(1), labels=torch.ones(1, device="meta"))
    assert "arg0 is on cpu" in str(err.value) and "labels is on meta" in str(err.value)
    assert ".to(device)" in str(err.value)


@pytest.mark.parametrize(("device", "error"),
                         [("gpu", ValueError), ("cuda:7", ValueError), (3.5, TypeError)], ids=repr)
def test_describe_devices_refuses_a_device_that_does_not_exist(device, error):
    with pytest.raises(error, match="Devices on this machine"):
        describe_devices(device)


@pytest.mark.parametrize("device", [None, "cpu", torch.device("cpu"), "meta"], ids=repr)
def test_describe_devices_with_good_devices(device):
    assert describe_devices(device).startswith(f"torch {torch.__version__}")
