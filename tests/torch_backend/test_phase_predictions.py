"""Note [Phase predictions]: with no measured profile, an identified model's phases take gpemu predict's number."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision

import gpemu.torch_backend as gt
from gpemu.cost.predict import predict_phase


@pytest.fixture(autouse=True)
def _no_shipped_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests compare the emulator's phase targets with predict_phase(db=None), the spec-model path: leave out
    the shipped H200 profile, whose rows at batch 1, 16, 64 and 256 bracket the batch sizes used here and would make
    the emulator's path "scaled-from" (Note [Between the source's measured batch sizes] in cost/predict.py)."""
    monkeypatch.setenv("GPEMU_BUILTIN_PROFILES", "0")


def _step_gpu_s(model: torch.nn.Module, x: torch.Tensor, opt: torch.optim.Optimizer) -> float:
    """Return the emulated GPU seconds of one training step (its kernels, from a synced start to a synced end)."""
    emu = gt.current_emulation()
    stats = emu.devices[0].stats
    torch.cuda.synchronize()
    before = stats.work_s["kernel"]
    loss = model(x).float().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    return stats.work_s["kernel"] - before


@pytest.mark.parametrize("size", [224, 64])
def test_an_unprofiled_gpu_takes_the_phase_prediction(size: int, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPEMU_PROFILE_DIR", str(tmp_path))  # no measured rows anywhere: the spec-model path
    batch = 2
    forward = predict_phase("h100", "resnet18", "forward", batch).value
    backward = predict_phase("h100", "resnet18", "backward", batch).value
    gt.install("h100", replay=False)
    try:
        model = torchvision.models.resnet18().cuda()  # identified by class name + parameter count
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(batch, 3, size, size, device="cuda")
        steps = [_step_gpu_s(model, x, opt) for _ in range(3)]
        described = gt.current_emulation().phases.describe()
    finally:
        gt.uninstall()
    if size == 224:
        # step 1 runs on per-op kernel sums; from step 2 on, forward + backward(+optimizer) equal the prediction
        assert steps[2] == pytest.approx(forward + backward, rel=1e-6)
        assert described["phase_predicted"]["resnet18/2/fp32/forward"] == [pytest.approx(forward), "spec-model"]
        assert steps[0] != pytest.approx(steps[2], rel=0.05)  # the per-op sum leaves out host dispatch
    else:  # 64x64 crops are not the profiled 224x224 step: per-op predictions, nothing calibrated
        assert described["phase_predicted"] == {} and described["calibrated"] == {}
        assert steps[2] == pytest.approx(steps[1], rel=1e-6)
        assert steps[2] < forward + backward


class _Task(torch.nn.Module):
    """A LightningModule-style wrapper: owns no parameters, calls the network it holds."""

    def __init__(self, net: torch.nn.Module, head: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.model = net
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.model(x)
        return y if self.head is None else self.head(y)


def test_a_parameter_free_wrapper_is_identified_as_the_network_it_holds() -> None:
    # Note [Wrapped models]: the wrapper's step is resnet18's step, so resnet18's profile applies
    assert gt.identify_model(_Task(torchvision.models.resnet18())) == "resnet18"
    assert gt.identify_model(_Task(_Task(torchvision.models.resnet50()))) == "resnet50"
    # a wrapper with parameters of its own (a second head) is a different network: no profile
    assert gt.identify_model(_Task(torchvision.models.resnet18(), torch.nn.Linear(1000, 10))) is None
    assert gt.identify_model(torch.nn.Sequential(torch.nn.Linear(4, 4))) is None


def test_a_replaced_classifier_head_keeps_the_architecture() -> None:
    # Note [Replaced heads]: fine-tuning swaps the last Linear; the backbone's parameters still identify the model
    food101 = torchvision.models.resnet50()
    food101.fc = torch.nn.Linear(2048, 101)
    assert gt.identify_model(food101) == "resnet50"
    assert gt.identify_model(torchvision.models.vit_b_16(num_classes=37)) == "vit_b_16"
    assert gt.identify_model(torchvision.models.resnet18(num_classes=10)) == "resnet18"
    # a deeper head (Linear -> ReLU -> Linear) adds parameters outside the last Linear: another network
    mlp_head = torchvision.models.resnet50()
    mlp_head.fc = torch.nn.Sequential(torch.nn.Linear(2048, 256), torch.nn.ReLU(), torch.nn.Linear(256, 3))
    assert gt.identify_model(mlp_head) is None


def test_a_channels_last_model_gets_the_nhwc_prediction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Note [Layout cost]: model.to(memory_format=torch.channels_last) is visible in the meta tensors' strides
    monkeypatch.setenv("GPEMU_PROFILE_DIR", str(tmp_path))
    batch = 2
    forward = predict_phase("h100", "resnet18", "forward", batch, memory_format="channels_last").value
    backward = predict_phase("h100", "resnet18", "backward", batch, memory_format="channels_last").value
    nchw = predict_phase("h100", "resnet18", "forward", batch).value
    assert forward != pytest.approx(nchw, rel=1e-3)  # NHWC batch norm has no plane ramp: the phases differ
    gt.install("h100", replay=False)
    try:
        model = torchvision.models.resnet18().cuda().to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(batch, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
        steps = [_step_gpu_s(model, x, opt) for _ in range(3)]
        described = gt.current_emulation().phases.describe()
    finally:
        gt.uninstall()
    assert described["phase_predicted"]["resnet18/2/fp32/channels_last/forward"] == [pytest.approx(forward),
                                                                                      "spec-model"]
    assert steps[2] == pytest.approx(forward + backward, rel=1e-6)


def test_per_op_pricing_sees_channels_last() -> None:
    # One fp16 3x3 convolution on an emulated A100: the NCHW backward pays cuDNN's transposes (Note [Layout cost]), NHWC not.
    gt.install("a100", replay=False)
    try:
        emu = gt.current_emulation()
        stats = emu.devices[0].stats
        conv = torch.nn.Conv2d(64, 64, 3, padding=1).cuda().half()
        x = torch.randn(32, 64, 56, 56, device="cuda", dtype=torch.float16)
        fwd_times, bwd_times = [], []
        for fmt in (torch.contiguous_format, torch.channels_last):
            conv = conv.to(memory_format=fmt)
            xi = x.contiguous(memory_format=fmt).requires_grad_()
            conv(xi).sum().backward()  # warm the op caches
            torch.cuda.synchronize()
            before = stats.work_s["kernel"]
            y = conv(xi)
            torch.cuda.synchronize()
            mid = stats.work_s["kernel"]
            torch.autograd.grad(y, [xi], torch.ones_like(y))
            torch.cuda.synchronize()
            assert y.is_contiguous(memory_format=fmt)
            fwd_times.append(mid - before)
            bwd_times.append(stats.work_s["kernel"] - mid)
    finally:
        gt.uninstall()
    # Note [NCHW forward on cuDNN 9]: the NCHW forward runs NCHW-native kernels, priced as the NHWC one
    assert fwd_times[0] == pytest.approx(fwd_times[1], rel=1e-9)
    # its backward transposes dy, x and dx, 32*64*56*56*2 bytes = 12.8 MB each: 3 * 25.7 MB read + written at well
    # under 2 TB/s (the ones_like and the weight gradient's share are the same in both layouts)
    assert bwd_times[0] - bwd_times[1] > 3 * 25.7e6 / 2039e9


def test_bf16_autocast_steps_take_the_amp_bf16_prediction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch.autocast(dtype=torch.bfloat16) is the "amp_bf16" workload dtype, not fp16 "amp": its phase target is
    # the bf16 trace's prediction (on an A100 the two peaks are equal; a V100 refuses bf16 autocast, as torch does)
    monkeypatch.setenv("GPEMU_PROFILE_DIR", str(tmp_path))
    batch = 2
    forward = predict_phase("a100", "resnet18", "forward", batch, "amp_bf16").value
    gt.install("a100", replay=False)
    try:
        model = torchvision.models.resnet18().cuda()
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            model(x).float().mean().backward()
        described = gt.current_emulation().phases.describe()
    finally:
        gt.uninstall()
    assert described["phase_predicted"]["resnet18/2/amp_bf16/forward"] == [pytest.approx(forward), "spec-model"]
    assert "resnet18/2/amp/forward" not in described["phase_predicted"]


def test_an_evaluation_forward_takes_the_training_forwards_scale(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Note [Evaluation passes]: with no measured rows (spec-model phase predictions), train resnet18 at batch 2, then
    # evaluate at batch 2 (scaled like the training forward) and at batch 3 (no training forward of that size: per op)
    monkeypatch.setenv("GPEMU_PROFILE_DIR", str(tmp_path))
    emu = gt.install("h100", replay=False)
    try:
        model = torchvision.models.resnet18().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        stats = emu.devices[0].stats

        def eval_gpu_s(batch: int) -> float:
            model.eval()
            images = torch.randn(batch, 3, 224, 224, device="cuda")
            torch.cuda.synchronize()
            before = stats.work_s["kernel"]
            with torch.no_grad():
                model(images)
            torch.cuda.synchronize()
            model.train()
            return stats.work_s["kernel"] - before

        per_op_s = eval_gpu_s(2)  # before any training step: nothing to scale by
        x = torch.randn(2, 3, 224, 224, device="cuda")
        for _ in range(3):
            _step_gpu_s(model, x, opt)
        tracker = emu.phases
        full = ("resnet18", 2, "fp32", "nchw", "forward")
        scale = tracker._targets[full] / tracker.prev[full]
        assert scale > 1.0  # the phase prediction adds host dispatch and fixed costs to the per-op kernel sum
        assert eval_gpu_s(2) == pytest.approx(per_op_s * scale, rel=1e-6)  # float sums of ~60 kernels
        assert eval_gpu_s(3) < per_op_s * scale  # batch 3 was never trained: per-op prices, unscaled
    finally:
        gt.uninstall()


def test_an_evaluation_only_run_takes_the_inference_prediction(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Note [Evaluation passes]: no training forward ever runs (an inference script). The first evaluation pass is
    # priced per op; from the second on, the pass is scaled to predict_phase(..., "inference") (Note [Inference
    # forward]) by the first pass's per-op sum, so its GPU work is that prediction
    from gpemu.cost.predict import predict_phase

    monkeypatch.setenv("GPEMU_PROFILE_DIR", str(tmp_path))  # no measured rows
    emu = gt.install("h100", replay=False)
    try:
        model = torchvision.models.resnet18().cuda().eval()
        stats = emu.devices[0].stats
        images = torch.randn(4, 3, 224, 224, device="cuda")
        passes = []
        for _ in range(3):
            torch.cuda.synchronize()
            before = stats.work_s["kernel"]
            with torch.no_grad():
                model(images)
            torch.cuda.synchronize()
            passes.append(stats.work_s["kernel"] - before)
        target = emu.phases._targets[("resnet18", 4, "fp32", "nchw", "inference")]
    finally:
        gt.uninstall()
    assert target == pytest.approx(predict_phase("h100", "resnet18", "inference", 4).value)
    assert passes[1] == pytest.approx(target, rel=1e-6) and passes[2] == pytest.approx(target, rel=1e-6)
    assert passes[0] != pytest.approx(target, rel=1e-3)  # the first pass: per-op prices, unscaled


def test_the_report_names_the_expected_error_of_a_phase_prediction(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from gpemu.cost.expected_error import load_table
    from gpemu.report.hooks import _timing_sources
    from gpemu.report.summary import timing_line

    monkeypatch.setenv("GPEMU_PROFILE_DIR", str(tmp_path))  # no measured rows: resnet18 on an H100 is spec-model
    gt.install("h100", replay=False)
    try:
        model = torchvision.models.resnet18().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(2, 3, 224, 224, device="cuda")
        for _ in range(2):
            _step_gpu_s(model, x, opt)
        sources = _timing_sources()
    finally:
        gt.uninstall()
    fwd = load_table()["paths"]["spec-model"]["forward"]  # resnet18 is in the fit: leave-one-GPU-out spec figures
    short = f"~{fwd['median_abs_pct']:.0f}% (p90 {fwd['p90_abs_pct']:.0f}%)"
    assert sources["phase_predictions"]["resnet18/2/fp32/forward"][1:] == ["spec-model", short]
    line = timing_line({"compute_s_by_source": {"phase-predicted": 1.0}, "calibrated_pct": 0.0, **sources})
    assert f"resnet18/2/fp32/forward {sources['phase_predictions']['resnet18/2/fp32/forward'][0] * 1e3:.1f} ms " \
           f"spec-model, expected |error| {short}" in line
    # Note [Published bias per GPU]: the run's GPU's published lean, per kind of model, ends the line
    pretrain = load_table()["published_by_gpu"]["lm-pretrain"]["h100-sxm5-80gb"]  # MosaicML's 13 MPT rows
    assert [b["model_kind"] for b in sources["published_bias"]] == ["vision", "lm", "lm-pretrain"]
    assert (f"LLM pretraining gpemu {abs(pretrain['signed_median_pct']):.0f}% faster ({pretrain['rows']} rows)"
            in line)


def test_a_frozen_backbone_keeps_the_forward_prediction_and_a_per_op_backward(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # Note [Frozen parameters]: only the new head trains (pytorch/tutorials transfer_learning's second part)
    monkeypatch.setenv("GPEMU_PROFILE_DIR", str(tmp_path))  # no measured rows anywhere: the spec-model path
    batch = 2
    forward = predict_phase("h100", "resnet18", "forward", batch).value
    backward = predict_phase("h100", "resnet18", "backward", batch).value

    def third_step(predict: bool) -> tuple[float, float]:
        """(forward, loss + backward + optimizer) GPU seconds of the third step."""
        monkeypatch.setenv("GPEMU_PHASE_PREDICT", "1" if predict else "0")
        gt.install("h100", replay=False)
        try:
            stats = gt.current_emulation().devices[0].stats
            model = torchvision.models.resnet18()
            for p in model.parameters():
                p.requires_grad = False
            model.fc = torch.nn.Linear(512, 2)  # the replaced head: still identified (Note [Replaced heads])
            model = model.cuda()
            opt = torch.optim.SGD(model.fc.parameters(), lr=0.1, momentum=0.9)
            x = torch.randn(batch, 3, 224, 224, device="cuda")
            for _ in range(3):
                torch.cuda.synchronize()
                t0 = stats.work_s["kernel"]
                out = model(x)
                torch.cuda.synchronize()
                t1 = stats.work_s["kernel"]
                loss = out.float().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                torch.cuda.synchronize()
            return t1 - t0, stats.work_s["kernel"] - t1
        finally:
            gt.uninstall()

    fwd_per_op, rest_per_op = third_step(predict=False)
    fwd, rest = third_step(predict=True)
    assert fwd == pytest.approx(forward, rel=1e-6)  # the forward still takes the prediction
    assert fwd_per_op < forward
    # the backward (the head's gradients, SGD on its 2 tensors) stays per op: before, it was scaled up to resnet18's
    # whole backward prediction
    assert rest == pytest.approx(rest_per_op, rel=1e-9)
    assert rest < 0.05 * backward


def test_regnets_are_identified() -> None:
    # RegNet constructors compute their stage widths with tensor ops, which failed under torch.device("meta"): no
    # RegNet was a candidate, so a RegNet step ran on per-op predictions instead of its phase prediction
    from gpemu.torch_backend.phases import identify_model

    assert identify_model(torchvision.models.regnet_y_400mf()) == "regnet_y_400mf"
    assert identify_model(torchvision.models.regnet_x_400mf()) == "regnet_x_400mf"


def test_gradient_accumulation_micro_steps_share_the_stepping_phases_scale(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Note [Accumulation steps]: micro-steps alternate "loss + backward" and "loss + backward + optimizer step + an
    # EMA-style update of every parameter". Each phase took the scale of the one before it (the other kind), so the
    # micro-steps alternated far above and below the prediction.
    monkeypatch.setenv("GPEMU_PROFILE_DIR", str(tmp_path))  # no measured rows anywhere: the spec-model path
    batch = 2
    backward = predict_phase("h100", "resnet18", "backward", batch).value
    gt.install("h100", replay=False)
    try:
        stats = gt.current_emulation().devices[0].stats
        model = torchvision.models.resnet18().cuda()
        ema = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        rest: list[float] = []  # GPU seconds of each micro-step after its forward
        for micro in range(8):
            out = model(x)
            torch.cuda.synchronize()
            t0 = stats.work_s["kernel"]
            out.float().mean().backward()
            if micro % 2 == 1:  # every second micro-step updates, then the EMA copies follow
                opt.step()
                opt.zero_grad()
                with torch.no_grad():
                    for e, p in zip(ema, model.parameters(), strict=True):
                        e.mul_(0.999).add_(p, alpha=0.001)
            torch.cuda.synchronize()
            rest.append(stats.work_s["kernel"] - t0)
    finally:
        gt.uninstall()
    # once the loop is seen to accumulate (after micro-step 0), every micro-step's loss + backward sums to the
    # backward prediction, and a stepping one adds its optimizer step and EMA update at their per-op prices: the
    # same numbers every cycle. Before, micro-steps alternated far above and below (3.2x the prediction)
    assert rest[2] == pytest.approx(backward, rel=1e-6) and rest[4] == pytest.approx(backward, rel=1e-6)
    assert rest[3] == pytest.approx(rest[5], rel=1e-6) and rest[5] == pytest.approx(rest[7], rel=1e-6)
    # (a stepping micro-step's backward also adds into the gradients the one before it left: 62 more kernels, scaled
    # with the rest of its backward; its SGD step and EMA copies are ~1 ms per op)
    assert backward < rest[3] < 2 * backward


@pytest.mark.parametrize("replay", [False, True])
def test_an_ema_update_after_the_step_adds_its_per_op_time(replay: bool, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # Note [Work after the step]: DeepLearningExamples' ConvNets `--use-ema` and timm's ModelEmaV2 update an EMA of
    # the weights after optimizer.step(), with no gradient accumulation. The backward phase (loss + backward + step)
    # was scaled to its prediction with the EMA's kernels inside it, so a step with an EMA read the same GPU time as
    # one without (ResNet-50, batch 64, amp, A100: 44.46 ms either way).
    monkeypatch.setenv("GPEMU_PROFILE_DIR", str(tmp_path))  # no measured rows anywhere: the spec-model path
    batch = 2
    forward = predict_phase("h100", "resnet18", "forward", batch).value
    backward = predict_phase("h100", "resnet18", "backward", batch).value
    gt.install("h100", replay=replay)
    try:
        emu = gt.current_emulation()
        stats = emu.devices[0].stats
        model = torchvision.models.resnet18().cuda()
        ema = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(batch, 3, 224, 224, device="cuda")

        def update_ema() -> float:
            torch.cuda.synchronize()
            t0 = stats.work_s["kernel"]
            with torch.no_grad():
                for e, p in zip(ema, model.parameters(), strict=True):
                    e.mul_(0.999).add_(p, alpha=0.001)
            torch.cuda.synchronize()
            return stats.work_s["kernel"] - t0

        per_op_ema = update_ema()  # before any forward: outside every phase, at the per-op prices
        steps: list[float] = []  # GPU seconds of each whole step: forward, backward, SGD step, EMA update
        emas: list[float] = []  # ... of its EMA update alone
        for _ in range(5):  # replayed from the third step on when replay is on
            torch.cuda.synchronize()
            t0 = stats.work_s["kernel"]
            model(x).float().mean().backward()
            opt.step()
            opt.zero_grad()
            emas.append(update_ema())
            steps.append(stats.work_s["kernel"] - t0)
    finally:
        gt.uninstall()
    # the EMA update is 2 kernels x 62 parameters at the per-op prices (>= 124 x the ~5.7 us per-kernel floor)
    assert per_op_ema > 124 * 5e-6
    # from the third step on (the first two calibrate), forward + loss + backward + SGD step sum to the two
    # predictions and the EMA update adds its per-op price. Before, the EMA's kernels were scaled into the backward
    # target with the rest (5.9x here: 4.8 ms) and the step read forward + backward, as a step without an EMA does
    assert emas[3] == pytest.approx(per_op_ema, rel=1e-6)
    assert steps[3] == pytest.approx(forward + backward + per_op_ema, rel=1e-6)
    assert steps[2] == pytest.approx(steps[3], rel=1e-6) and steps[4] == pytest.approx(steps[3], rel=1e-6)


def test_a_scripted_model_is_built_and_identified_under_emulation() -> None:
    # Note [Scripted modules]: DeepLearningExamples' ConvNets `--jit script` died in torch.jit.script under emulation
    # (gpemu's Module.__setattr__ read `_parameters` before the RecursiveScriptModule had one), and once built the
    # scripted model was not identified, so its steps ran on per-op predictions (ResNet-50, batch 64, amp, A100:
    # 32.07 ms of GPU per step against 44.46 ms for the same model in eager)
    from gpemu.torch_backend.phases import identify_model

    gt.install("h100")  # replay on: the __setattr__ patch is installed
    try:
        scripted = torch.jit.script(torchvision.models.resnet18().cuda())
        assert identify_model(scripted) == "resnet18"
    finally:
        gt.uninstall()


def test_a_step_before_the_backward_pass_leaves_the_phase_scaled(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Note [Work after the step]: only a step after the phase's backward pass closes it. A loop that steps first
    # (here: on the previous iteration's gradients) keeps loss + backward + step scaled to the predictions; closing at
    # that step would leave the backward pass per op (and calibrate the next step on an empty sum)
    monkeypatch.setenv("GPEMU_PROFILE_DIR", str(tmp_path))
    batch = 2
    forward = predict_phase("h100", "resnet18", "forward", batch).value
    backward = predict_phase("h100", "resnet18", "backward", batch).value
    gt.install("h100", replay=False)
    try:
        stats = gt.current_emulation().devices[0].stats
        model = torchvision.models.resnet18().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        steps: list[float] = []
        for _ in range(4):
            torch.cuda.synchronize()
            t0 = stats.work_s["kernel"]
            out = model(x)
            opt.step()
            opt.zero_grad()
            out.float().mean().backward()
            torch.cuda.synchronize()
            steps.append(stats.work_s["kernel"] - t0)
    finally:
        gt.uninstall()
    assert steps[3] == pytest.approx(forward + backward, rel=1e-6)



_FIRST_STEP = """
import gc, weakref, torch
import gpemu.torch_backend as gt
gt.install("a100", replay=False)
gc.disable()
lin = torch.nn.Linear(1024, 1024).cuda()
x = torch.randn(64, 1024, device="cuda")
y = lin(x)
y.sum().backward()
ref = weakref.ref(y)
del y
print("freed" if ref() is None else "held")
"""


def test_the_first_forward_leaves_no_cycle_holding_its_output() -> None:
    # Note [Imports inside the first forward]: with the collector off, the first step's output (64 x 1024 x 4 =
    # 262,144 bytes of a Linear(1024, 1024) at batch 64) must be freed by `del`, as on a GPU. A fresh interpreter:
    # this module has imported torchvision already, which hides the cycle.
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FIRST_STEP], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "freed", out.stdout + out.stderr
