"""Loops without a DataLoader: each optimizer step ends an iteration; with a DataLoader, fetches do."""

from __future__ import annotations

import torch

from gpemu.device import EmulatedGPU, ManualClock
from gpemu.report.hooks import RunReport


def _steps(n: int) -> None:
    w = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([w], lr=0.1)
    for _ in range(n):
        w.sum().backward()
        opt.step()


def test_each_optimizer_step_marks_an_iteration_without_a_dataloader() -> None:
    report = RunReport([EmulatedGPU("v100", clock=ManualClock())], print_summary=False)
    report.patch_optimizer()
    try:
        _steps(3)
    finally:
        report.unpatch_optimizer()
    # 3 steps = 3 iteration boundaries: windows 0 and 1 are closed, window 2 is still open.
    assert len(report.collector.iterations) == 3


def test_dataloader_fetches_take_precedence_over_optimizer_steps() -> None:
    report = RunReport([EmulatedGPU("v100", clock=ManualClock())], print_summary=False)
    report.patch_dataloader()
    report.patch_optimizer()
    try:
        loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2)
        for _ in loader:  # 2 batches = 2 iterations
            _steps(2)  # 4 optimizer steps in all: they must not add iterations
    finally:
        report.unpatch_optimizer()
        report.unpatch_dataloader()
    assert len(report.collector.iterations) == 2


def test_backward_passes_mark_iterations_when_there_is_no_optimizer() -> None:
    report = RunReport([EmulatedGPU("v100", clock=ManualClock())], print_summary=False)
    report.patch_optimizer()
    try:
        w = torch.nn.Parameter(torch.zeros(4))
        for _ in range(4):  # word_language_model style: manual update, no optimizer
            w.sum().backward()
            with torch.no_grad():
                w.add_(w.grad, alpha=-0.1)
    finally:
        report.unpatch_optimizer()
    # backward passes 2, 3 and 4 are boundaries (the first might still be followed by an optimizer step):
    # 3 boundaries = windows 0 and 1 closed, window 2 open
    assert len(report.collector.iterations) == 3
    assert torch.autograd.backward.__module__ == "torch.autograd"  # unpatched


def test_backward_passes_do_not_add_iterations_once_a_step_is_seen() -> None:
    report = RunReport([EmulatedGPU("v100", clock=ManualClock())], print_summary=False)
    report.patch_optimizer()
    try:
        _steps(3)  # backward, step, backward, step, ...: only the 3 steps are boundaries
    finally:
        report.unpatch_optimizer()
    assert len(report.collector.iterations) == 3


def test_gradient_accumulation_before_the_first_step_adds_no_iterations() -> None:
    report = RunReport([EmulatedGPU("v100", clock=ManualClock())], print_summary=False)
    report.patch_optimizer()
    try:
        w = torch.nn.Parameter(torch.zeros(4))
        opt = torch.optim.SGD([w], lr=0.1)
        for _ in range(3):  # nanoGPT style: 4 micro-steps (backward passes) per optimizer step, no DataLoader
            for _ in range(4):
                w.sum().backward()
            opt.step()
    finally:
        report.unpatch_optimizer()
    # Before the fix, backward passes 2-4 of the first step were boundaries too (3 + 3 = 6 windows); the first step
    # drops those, so only the 3 steps are boundaries: windows 0 and 1 closed, window 2 open.
    assert len(report.collector.iterations) == 3
    assert [w.index for w in report.collector.iterations] == [0, 1, 2]


def test_optimizer_steps_inside_backward_end_one_iteration_per_backward() -> None:
    # Note [Optimizer steps in backward]: one optimizer per parameter, stepped from a post-accumulate-grad hook (the
    # pytorch/tutorials "optimizer step in backward" idiom)
    report = RunReport([EmulatedGPU("v100", clock=ManualClock())], print_summary=False)
    report.patch_optimizer()
    try:
        params = [torch.nn.Parameter(torch.zeros(4)) for _ in range(5)]
        opts = {p: torch.optim.SGD([p], lr=0.1) for p in params}

        def hook(q: torch.Tensor) -> None:
            opts[q].step()
            opts[q].zero_grad()

        for p in params:
            p.register_post_accumulate_grad_hook(hook)
        for _ in range(3):
            sum(p.sum() for p in params).backward()
    finally:
        report.unpatch_optimizer()
    # 3 backward passes x 5 fused steps: before the fix each of the 15 steps was a boundary (15 windows); now each
    # backward pass that stepped is one: 3 boundaries = windows 0 and 1 closed, window 2 open
    assert len(report.collector.iterations) == 3
    assert report._steps_seen == 3


def test_fused_steps_after_plain_steps_still_end_iterations() -> None:
    # the tutorial's order: 2 plain steps (backward, step), then 2 backward passes with the steps fused into them
    report = RunReport([EmulatedGPU("v100", clock=ManualClock())], print_summary=False)
    report.patch_optimizer()
    try:
        _steps(2)
        params = [torch.nn.Parameter(torch.zeros(4)) for _ in range(3)]
        opts = {p: torch.optim.SGD([p], lr=0.1) for p in params}
        def hook(q: torch.Tensor) -> None:
            opts[q].step()

        for p in params:
            p.register_post_accumulate_grad_hook(hook)
        for _ in range(2):
            sum(p.sum() for p in params).backward()
    finally:
        report.unpatch_optimizer()
    # 2 plain steps + 2 stepping backward passes = 4 boundaries: windows 0-2 closed, window 3 open (before the fix
    # 2 + 2 x 3 fused steps = 8 boundaries)
    assert len(report.collector.iterations) == 4


def test_several_optimizers_stepped_after_one_backward_make_one_iteration() -> None:
    report = RunReport([EmulatedGPU("v100", clock=ManualClock())], print_summary=False)
    report.patch_optimizer()
    try:
        enc, dec = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(4))
        enc_opt, dec_opt = torch.optim.SGD([enc], lr=0.1), torch.optim.SGD([dec], lr=0.1)
        for _ in range(3):  # pytorch/tutorials seq2seq_translation_tutorial's train(): one backward, two steps
            (enc.sum() + dec.sum()).backward()
            enc_opt.step()
            dec_opt.step()
    finally:
        report.unpatch_optimizer()
    # 3 training steps = 3 boundaries (the encoder steps), as _steps(3) gives; 6 before the fix
    assert len(report.collector.iterations) == 3
