import pytest
import torch
from torch import nn

from helpers import devices
from helpers.devices import (
    DeviceMismatchError,
    available_devices,
    best_device,
    check_same_device,
    describe_devices,
    device_of,
    module_device,
    resolve_device,
)


def test_available_devices_lists_cpu_last():
    names = available_devices()
    assert names[-1] == "cpu"
    assert len(names) == len(set(names))


def test_best_device_prefers_an_accelerator_when_present():
    dev = best_device()
    assert str(dev) == available_devices()[0]
    if not torch.cuda.is_available() and not devices.has_gpu():
        assert dev == torch.device("cpu")


def test_override_argument_and_environment(monkeypatch):
    assert best_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("BOOK_DEVICE", "cpu")
    assert best_device() == torch.device("cpu")


def test_environment_cannot_choose_the_meta_device(monkeypatch):
    monkeypatch.setenv("BOOK_DEVICE", "meta")
    with pytest.raises(ValueError) as err:
        best_device()
    message = str(err.value)
    assert "$BOOK_DEVICE" in message and "meta" in message and "no data" in message
    with pytest.raises(ValueError, match="no data"):
        best_device("meta")
    # Asked for by name, for the pitfall demonstrations, meta is still a device.
    assert resolve_device("meta") == torch.device("meta")


def test_environment_errors_name_the_variable(monkeypatch):
    monkeypatch.setenv("BOOK_DEVICE", "banana")
    with pytest.raises(ValueError, match=r"\$BOOK_DEVICE.*'banana'"):
        best_device()
    # An explicit argument is not blamed on the environment.
    monkeypatch.delenv("BOOK_DEVICE")
    with pytest.raises(ValueError) as err:
        best_device("banana")
    assert "BOOK_DEVICE" not in str(err.value)


@pytest.mark.parametrize(("bad", "hint"), [("gpu", "'cuda'"), ("GPU:1", "'cuda:1'"), ("gpu1", "'cuda'")])
def test_gpu_gets_a_did_you_mean_hint(bad, hint, monkeypatch):
    with pytest.raises(ValueError, match=f"did you mean {hint}"):
        resolve_device(bad)
    monkeypatch.setenv("BOOK_DEVICE", bad)
    with pytest.raises(ValueError, match=rf"\$BOOK_DEVICE.*did you mean {hint}"):
        best_device()


def test_environment_override_is_checked(monkeypatch):
    monkeypatch.setenv("BOOK_DEVICE", "cuda:99")
    with pytest.raises(ValueError, match="cuda:99"):
        best_device()


def test_resolve_device_normalises():
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert resolve_device(" cpu ") == torch.device("cpu")
    if torch.cuda.is_available():
        assert resolve_device("cuda") == torch.device("cuda", 0)


def test_describe_devices_mentions_versions_and_cpu():
    text = describe_devices()
    assert torch.__version__ in text
    assert "cpu" in text
    if not devices.has_gpu():
        assert "no GPU" in text


def test_module_device_and_device_of():
    net = nn.Linear(2, 3)
    assert module_device(net) == torch.device("cpu")
    assert device_of(net) == torch.device("cpu")
    assert device_of(torch.zeros(1, device="meta")) == torch.device("meta")
    assert device_of("not a tensor") is None
    net.to("meta")
    assert module_device(net) == torch.device("meta")


def test_module_device_without_tensors():
    with pytest.raises(ValueError, match="no parameters or buffers"):
        module_device(nn.ReLU())


def test_module_split_across_devices_names_the_tensor():
    net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    net[1].to("meta")
    with pytest.raises(DeviceMismatchError, match=r"'1\.weight' on meta"):
        module_device(net)


def test_check_same_device_returns_the_device():
    x = torch.zeros(3)
    assert check_same_device(x, model=nn.Linear(3, 1)) == torch.device("cpu")


def test_check_same_device_says_which_object_is_where():
    model = nn.Linear(3, 1).to("meta")
    x = torch.zeros(2, 3)
    with pytest.raises(DeviceMismatchError) as err:
        check_same_device(model=model, x=x, lr=0.1)
    message = str(err.value)
    assert "model is on meta" in message and "x is on cpu" in message
    assert "lr" not in message  # non-tensors are ignored


def test_check_same_device_skips_modules_without_tensors():
    x = torch.zeros(2, 3)
    assert check_same_device(act=nn.ReLU(), x=x) == torch.device("cpu")
    assert check_same_device(nn.Linear(3, 1), nn.ReLU(), x) == torch.device("cpu")
    assert device_of(nn.ReLU()) is None
    with pytest.raises(DeviceMismatchError, match="x is on cpu"):
        check_same_device(act=nn.ReLU(), model=nn.Linear(3, 1).to("meta"), x=x)


class _FakeProps:
    name, major, minor, multi_processor_count, total_memory = "Fake GPU", 9, 0, 132, 80 * 2**30


def _two_fake_gpus(monkeypatch):
    """Pretend this machine has two CUDA GPUs and record which ones get a CUDA context."""
    touched = []

    def mem_get_info(device=None):
        touched.append(torch.device(device))
        return 70 * 2**30, 80 * 2**30

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: _FakeProps())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    return touched


def test_describe_devices_creates_no_context_on_other_gpus(monkeypatch):
    touched = _two_fake_gpus(monkeypatch)
    text = describe_devices(torch.device("cuda:1"))
    assert touched == [torch.device("cuda:1")], "only the device in use is asked for its free memory"
    assert "cuda:0  Fake GPU" in text and "cuda:1  Fake GPU" in text
    assert text.count("80.0 GiB") == 2 and text.count("70.0 GiB free") == 1
    touched.clear()
    for quiet in (None, torch.device("cpu")):
        assert "Fake GPU, compute capability 9.0, 132 SMs" in describe_devices(quiet)
        assert touched == [], f"describe_devices({quiet}) touched a GPU's memory"


def test_cuda_without_an_index_is_the_current_gpu(monkeypatch):
    _two_fake_gpus(monkeypatch)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert resolve_device("cuda") == torch.device("cuda:1")
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    assert available_devices() == ["cuda:0", "cuda:1", "cpu"]


def test_describe_devices_names_the_rocm_runtime(monkeypatch):
    # A ROCm build lists AMD GPUs as cuda:i but has no CUDA version: the HIP version is shown.
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", "6.4.43482", raising=False)
    text = describe_devices()
    assert "ROCm HIP runtime 6.4.43482" in text and "CUDA runtime" not in text
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert "CUDA runtime none (this torch build has no CUDA)" in describe_devices()
