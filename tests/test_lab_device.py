"""``Lab(device=...)``: a device index on a GPU and on the simulator, bad indices refused, and the dashboard's GPU
picker (shown for the real GPU on a machine with several; hidden with one and for the simulator)."""

from __future__ import annotations

import pytest
import torch

from memviz.backends import GpuInfo, cuda_available, cuda_devices, device_index
from memviz.devices import PRESETS, SIM_NODE_GPUS, SimulatedDevice
from memviz.errors import InputError, InputTypeError
from memviz.lab import Lab
from memviz.snapshots import SnapshotHistory
from memviz.widgets import dashboard
from memviz.widgets._common import guarded
from memviz.widgets.backend_panel import REAL, SIM, BackendPanel

H200 = PRESETS["H200"].total_memory_bytes
TWO_GPUS = [GpuInfo(0, "NVIDIA H200", H200), GpuInfo(1, "NVIDIA H200", H200)]


@pytest.mark.parametrize("device", [1, "cuda:1", " CUDA:1 ", torch.device("cuda", 1), torch.device("cuda:1")])
def test_every_form_of_an_index_names_the_same_device(device):
    assert device_index(device) == 1
    assert Lab("sim", device=device).backend.index == 1


def test_cuda_alone_is_the_current_device():
    assert device_index("cuda") is None and device_index(torch.device("cuda")) is None
    assert Lab("sim", device="cuda").backend.index == 0  # the simulator's current device is cuda:0


def test_a_simulated_gpu_by_index_is_named_so_in_its_snapshot_and_messages():
    lab = Lab("sim", device=2, cap="1 GiB")
    assert lab.backend.index == 2 and "cuda:2, " in lab.describe()
    lab.allocate("100 MiB", name="x")
    snap = lab.snapshot()
    assert [s["device"] for s in snap["segments"]] == [2] and [s["device"] for s in lab.segments()] == [2]
    assert [len(t) for t in snap["device_traces"]] == [0, 0, 2]  # segment_alloc + alloc, on device 2's trace
    history = SnapshotHistory(snap, device=2)
    assert history.timeline.allocated_bytes[-1] == 100 << 20
    oom = lab.allocate("2 GiB", name="y").oom
    assert oom is not None and "GPU 2 has a total capacity" in oom.message  # as torch names cuda:2


def test_an_index_keeps_the_simulated_gpu_and_a_preset_keeps_index_0():
    assert Lab("sim", device="H200").backend.index == 0
    gpu = SimulatedDevice("NVIDIA H200 (simulated)", H200, index=5)
    backend = Lab("sim", device=gpu, cap="2 GiB").backend
    assert (backend.index, backend.total_memory_bytes, backend.cap_bytes) == (5, H200, 2 << 30)
    if not cuda_available():  # the simulator's default GPU is a T4 where there is no real one to mirror
        assert Lab(device=3).backend.device_name == PRESETS["T4"].name


@pytest.mark.skipif(cuda_available(), reason="without CUDA, 'auto' is the simulator")
def test_auto_without_a_gpu_is_the_simulated_node():
    lab = Lab(device=SIM_NODE_GPUS - 1)
    assert lab.backend.kind == "sim" and lab.backend.index == SIM_NODE_GPUS - 1
    assert cuda_devices() == []  # the dashboard's picker has nothing to offer


@pytest.mark.parametrize(
    ("device", "error", "words"),
    [
        (SIM_NODE_GPUS, InputError, r"the simulator models a node of 8 GPUs, cuda:0 to cuda:7$"),
        (-1, InputError, r"a device index is 0 or more \(cuda:0 is the first GPU\), not -1"),
        ("cuda:x", InputError, r"device 'cuda:x' is not a CUDA device: write 'cuda:N'"),
        ("cuda:-1", InputError, "is not a CUDA device"),
        ("cuda1", InputError, "is not a CUDA device"),
        (True, InputTypeError, "a device index is an int such as 1.*not True"),
        (torch.device("cpu"), InputError, "is not a CUDA device: memviz watches the CUDA caching allocator"),
        (16 << 30, InputError, "an int is a device index.*for a simulated GPU of 17,179,869,184 bytes pass a size"),
    ],
)
def test_a_bad_device_is_refused_clearly(device, error, words):
    with pytest.raises(error, match=words):
        Lab("sim", device=device)


def test_a_simulated_gpu_checks_its_index():
    with pytest.raises(InputError, match="a device index from 0 to 7, not 8"):
        SimulatedDevice("x", 1 << 30, index=8)
    with pytest.raises(InputTypeError, match="not str '1'"):
        SimulatedDevice("x", 1 << 30, index="1")


@pytest.mark.cuda
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
def test_a_cuda_index_the_machine_lacks_is_refused():
    count = torch.cuda.device_count()
    assert Lab("cuda", device="cuda:0").backend.index == 0
    assert Lab("cuda").backend.index == torch.cuda.current_device()
    for bad in (count, 7 if count < 8 else count + 1):
        with pytest.raises(InputError, match=rf"from 0 to {count - 1} \(this machine has"):
            Lab("cuda", device=bad)
    with pytest.raises(InputTypeError, match="a CUDA device is an index"):
        Lab("cuda", device="H200")


# -- the GPU picker --------------------------------------------------------------------------------


def panel(lab: Lab, gpus: list[GpuInfo]) -> BackendPanel:
    """The backend panel as the dashboard builds it, on a machine with ``gpus`` (the picker's only input)."""
    return BackendPanel(lab, guarded(None), lambda: None, gpus=gpus)


def shown(widget) -> bool:
    return widget.layout.display != "none"


def test_the_picker_lists_the_gpus_for_the_real_gpu_and_hides_for_the_simulator():
    p = panel(Lab("sim", device="T4"), TWO_GPUS)
    assert list(p.kind.options) == [SIM, REAL] and not shown(p.gpu)
    assert [label for label, _ in p.gpu.options] == ["cuda:0 · NVIDIA H200 · 139.80 GiB",
                                                     "cuda:1 · NVIDIA H200 · 139.80 GiB"]
    p.kind.value = REAL
    assert shown(p.gpu) and not shown(p.device) and p.config.disabled
    p.gpu.value = 1
    assert p.lab_settings() == {"backend": "cuda", "device": 1, "cap": None}
    p.kind.value = SIM
    assert not shown(p.gpu) and p.lab_settings()["device"] == "T4"


def test_the_picker_hides_with_one_gpu_and_without_any():
    one = panel(Lab("sim"), TWO_GPUS[:1])
    one.kind.value = REAL
    assert not shown(one.gpu) and one.lab_settings()["device"] == 0
    none = panel(Lab("sim"), [])
    assert list(none.kind.options) == [SIM] and not shown(none.gpu) and none.gpu.options == ()


def test_new_lab_on_the_simulator_keeps_the_lab_s_gpu_index():
    d = dashboard(Lab("sim", device=3, cap="1 GiB"), live=False)
    try:
        d.controls.device.value = "A100-80GB"
        d.controls.buttons["new lab"].click()
        backend = d.lab.backend
        assert (backend.index, backend.device_name) == (3, PRESETS["A100-80GB"].name)
        assert "cuda:3, NVIDIA A100 80 GB" in d.header.value and d.controls.error == ""
        lab = d.lab
        d.controls.cap.value = "1 TiB"  # bad input: an error, the same lab
        d.controls.buttons["new lab"].click()
        assert d.lab is lab and "more than the device's 80.00 GiB" in d.controls.error
    finally:
        d.close()


@pytest.mark.cuda
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
def test_the_dashboard_picker_on_this_gpu_machine():
    d = dashboard(Lab("cuda", cap="1 GiB"), live=False)
    try:
        count = torch.cuda.device_count()
        assert [v for _, v in d.controls.gpu.options] == list(range(count))
        assert shown(d.controls.gpu) == (count > 1) and d.controls.gpu.value == d.lab.backend.index
    finally:
        d.close()
