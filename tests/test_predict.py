"""memviz.predict on real torch (the CPU build in CI): the contract, the recorded H200 truth, bad input."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import memviz  # noqa: E402
from memviz import examples as programs  # noqa: E402


def test_a_cap_below_the_need_is_an_oom_naming_the_op_and_line() -> None:
    p = memviz.predict(programs.mlp_training, device="H200", cap="1 GiB", batch=256)
    assert not p.fits and p.oom is not None
    assert p.oom.requested_bytes > 0 and "CUDA out of memory" in p.oom.message
    assert "examples.py" in p.oom.line and p.oom.op
    assert p.peak_reserved_bytes <= 1 << 30


def test_breakdown_timeline_phases_and_snapshot() -> None:
    p = memviz.predict(programs.mlp_training, device="A100-40GB", batch=64, steps=2)
    at_peak = p.breakdown()
    params = (3 * 64 * 64 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 100 + 100) * 4
    assert at_peak["parameters"] == params
    assert at_peak["optimizer state"] in (0, 2 * params)
    # the breakdown counts requested sizes; allocated bytes count the blocks, rounded up (512 B multiples): both
    # agree with the simulator's own blocks at the peak
    state = p.snapshot(at=p.peak_event_index)
    live = [b for s in state["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert sum(at_peak.values()) == sum(b["requested_size"] for b in live)
    assert sum(b["size"] for b in live) == p.events[p.peak_event_index].allocated_bytes == p.peak_allocated_bytes
    assert sum(at_peak.values()) < p.peak_allocated_bytes  # this MLP has requests that are not 512 B multiples
    phases = [ph for _, ph in p.phases]
    assert {"forward", "backward", "optimizer"} <= set(phases)
    snap = p.snapshot()
    assert {"segments", "device_traces"} <= set(snap)
    assert sum(s["total_size"] for s in snap["segments"]) == p.stats["reserved_bytes.all.current"]


def test_nothing_global_is_left_changed() -> None:
    import torch.optim.optimizer as optimizer

    rng = torch.get_rng_state()
    def state() -> tuple:
        return (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"), torch.cuda.is_available,
                torch.cuda.synchronize, torch.cuda.memory_allocated, torch.Tensor.cuda, torch.is_grad_enabled(),
                torch.clear_autocast_cache, torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack(),
                sorted(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastIPU")),
                torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.AutocastIPU),
                optimizer._get_foreach_kernels_supported_devices(), torch.accelerator.current_stream,
                torch.accelerator.memory.memory_stats, str(torch.accelerator.current_accelerator()))

    before = state()

    inside = {}

    def bad() -> None:
        torch.manual_seed(123)
        x = torch.randn(4, 4, device="cuda")
        # torch.accelerator answers for the target GPU on either build (torch.optim's step asks it)
        inside["accelerator"] = str(torch.accelerator.current_accelerator(check_available=True))
        inside["capturing"] = torch.accelerator.current_stream().is_capturing()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            torch.set_grad_enabled(False)
            raise KeyError("the user's own error")
        del x

    with pytest.raises(KeyError, match="the user's own error"):
        memviz.predict(bad)
    assert before == state()
    assert inside == {"accelerator": "cuda", "capturing": False}
    assert torch.equal(rng, torch.get_rng_state())
    assert torch.ones(2).sum().item() == 2.0  # ordinary torch still works
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16


def test_predicting_is_true_inside() -> None:
    seen = []
    memviz.predict(lambda: seen.append(memviz.predicting()))
    assert seen == [True] and not memviz.predicting()


def test_the_programs_own_error_comes_back() -> None:
    def prog() -> None:
        a = torch.randn(4, 3, device="cuda")
        a @ torch.randn(4, 3, device="cuda")  # shapes do not match, as on a GPU

    with pytest.raises(RuntimeError, match=r"same reduction dim[\s\S]*stopped after 2 allocator events"):
        memviz.predict(prog)


def test_bad_device_and_cap_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown simulated device"):
        memviz.predict(programs.mlp_training, device="Voodoo2")
    with pytest.raises(ValueError):
        memviz.predict(programs.mlp_training, device="T4", cap="-3 GiB")


def test_max_batch_is_the_cliff() -> None:
    def prog(batch: int) -> None:
        model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512)).cuda()
        opt = torch.optim.AdamW(model.parameters())
        x = torch.randn(batch, 512, device="cuda")
        for _ in range(2):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    cap = "256 MiB"
    best = memviz.max_batch(prog, device="H100", cap=cap)
    assert best > 1
    assert memviz.predict(prog, best, device="H100", cap=cap).fits
    assert not memviz.predict(prog, best + 1, device="H100", cap=cap).fits


def test_autocast_keeps_the_bf16_weight_copies_until_the_region_ends() -> None:
    def prog(amp: bool) -> None:
        lin = torch.nn.Linear(1024, 1024, bias=False).cuda()
        x = torch.randn(16, 1024, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            y = lin(x)
            assert y.dtype == (torch.bfloat16 if amp else torch.float32)
            lin(x)  # the weight's bf16 copy comes from the cache: no second copy
        y.float().sum().backward()

    fp32 = memviz.predict(prog, False, device="A100-80GB")
    bf16 = memviz.predict(prog, True, device="A100-80GB")
    casts = [e for e in bf16.events if e.action == "alloc" and e.op == "_to_copy.default" and e.phase == "forward"]
    # the weight then x (autocast casts its arguments right to left, as the H200 trace shows), x again
    # (not a parameter: not cached), y.float() after
    assert [e.nbytes for e in casts] == [1024 * 1024 * 2, 16 * 1024 * 2, 16 * 1024 * 2, 16 * 1024 * 4]
    assert fp32.peak_allocated_bytes != bf16.peak_allocated_bytes


def test_inference_mode_casts_the_weight_at_each_use_as_the_installed_torch_does() -> None:
    """torch 2.11 (the H200's) and later do not keep autocast's weight copies under inference_mode: each
    Linear call casts its weight again and frees the copy after the op (the H200's inference recordings);
    no_grad keeps one copy for the region. The predictor asks the installed torch (on CPU autocast)."""
    from memviz.predictor.autocast import caches_under_inference_mode

    def prog(mode: str) -> None:
        lin = torch.nn.Linear(1024, 1024, bias=False).cuda()
        x = torch.randn(16, 1024, device="cuda")
        with getattr(torch, mode)(), torch.autocast("cuda", dtype=torch.bfloat16):
            lin(x)
            lin(x)

    if tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 11):
        pytest.skip("the H200 recorded torch 2.11's behaviour (pytorch#165068); older builds keep one copy")
    weight_copy = 1024 * 1024 * 2
    copies = {mode: [e for e in memviz.predict(prog, mode, device="H100").events
                     if e.action == "alloc" and e.nbytes == weight_copy] for mode in ("no_grad", "inference_mode")}
    assert len(copies["no_grad"]) == 1
    assert len(copies["inference_mode"]) == 2 and not caches_under_inference_mode()


def test_fp16_with_grad_scaler_and_a_model_built_on_meta() -> None:
    def prog() -> None:
        with torch.device("meta"):
            model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
        model = model.to_empty(device="cuda")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cuda")
        x, y = torch.randn(32, 256, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
        for _ in range(2):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()

    p = memviz.predict(prog, device="T4")
    assert p.fits and p.breakdown()["parameters"] == (256 * 256 + 256 + 256 * 10 + 10) * 4


def test_what_is_not_modelled_is_said() -> None:
    def prog() -> None:
        lstm = torch.nn.LSTM(16, 32).cuda()
        lstm(torch.randn(5, 3, 16, device="cuda"))[0].sum().backward()

    p = memviz.predict(prog, device="H200")
    assert p.fits and any("recurrent" in note for note in p.notes)
    assert memviz.predict(programs.mlp_training, device="H200", batch=8, steps=1).notes == []


def test_a_rule_measured_on_another_architecture_says_so() -> None:
    """cuBLAS's workspaces are torch's source on every architecture; cuDNN's were measured on the H200 only."""
    assert memviz.predict(programs.mlp_training, device="T4", batch=8, steps=1).notes == []
    notes = memviz.predict(programs.resnet_training, device="T4", batch=2, depth=18, steps=1).notes
    assert notes == ["cuDNN convolution workspaces: measured on H200 (sm90, torch 2.11.0+cu130, cuDNN 9.19); "
                     "applied to Turing (sm75) unmeasured"]
    assert memviz.predict(programs.resnet_training, device="H100", batch=2, depth=18, steps=1).notes == []


def test_snapshot_at_an_event_is_the_prediction_replayed_to_there() -> None:
    def prog() -> None:
        a = torch.empty(30 << 20, dtype=torch.uint8, device="cuda")
        b = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
        del a
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() == 20 << 20  # b's 20 MiB segment: the simulator answers
        del b

    p = memviz.predict(prog, device="T4")
    assert [e.action for e in p.events] == ["alloc", "alloc", "free", "empty_cache", "free"]
    assert sum(s["total_size"] for s in p.snapshot(at=1)["segments"]) == (30 << 20) + (20 << 20)
    assert sum(s["total_size"] for s in p.snapshot(at=3)["segments"]) == 20 << 20
    assert p.snapshot(at=4)["segments"] == p.snapshot()["segments"]
    with pytest.raises(IndexError):
        p.snapshot(at=5)


def test_default_device_cuda_and_torch_compile() -> None:
    def prog() -> None:
        torch.set_default_device("cuda")
        lin = torch.compile(torch.nn.Linear(1024, 1024, bias=False))
        assert torch.get_default_device() == torch.device("cuda", 0)
        lin(torch.randn(8, 1024)).sum().backward()

    p = memviz.predict(prog, device="H200")
    assert p.breakdown(len(p.events) - 1)["gradients"] == 1024 * 1024 * 4
    assert any("torch.compile" in note for note in p.notes)
    assert torch.get_default_device() == torch.device("cpu")


def test_a_torch_older_than_the_floor_is_refused_with_what_is_supported() -> None:
    from memviz.predictor.patches import TORCH_FLOOR, check_torch

    assert TORCH_FLOOR == (2, 9)
    check_torch("2.9.1+cu128")
    check_torch(torch.__version__)
    with pytest.raises(memviz.InputError, match=r"needs torch >= 2\.9 \(verified on 2\.9\.1.*this is torch 2\.8\.0"):
        check_torch("2.8.0")
    with pytest.raises(memviz.InputError, match="cannot read the torch version"):
        check_torch("nightly")
    check_torch("2.11.0", distributed=True)
    with pytest.raises(memviz.InputError, match=r"world_size=\.\.\.\) needs torch >= 2\.11"):
        check_torch("2.9.1+cu128", distributed=True)
