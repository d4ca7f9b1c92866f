"""Idioms of Hugging Face transformers and timm training scripts: first reproduced with plain torch (always run),
then with the libraries themselves when they are installed (they are not gpemu dependencies)."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import gpemu.torch_backend as gt


@pytest.fixture
def a100() -> Iterator[gt.Emulation]:
    """Return an installed 1x A100 emulation; uninstall afterwards."""
    e = gt.install("a100")
    yield e
    gt.uninstall()


class _KwargsModel(nn.Module):
    """A model called as `model(**batch)` whose loss is computed inside forward (Hugging Face style)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.head = nn.Linear(32, 2)

    def forward(self, input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.head(self.emb(input_ids).mean(1))
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def test_keyword_only_model_calls_are_the_top_module_and_replay(a100: gt.Emulation) -> None:
    model = _KwargsModel().cuda()
    opt = torch.optim.AdamW(model.parameters())
    batch = {"input_ids": torch.randint(0, 100, (8, 16)).cuda(), "labels": torch.randint(0, 2, (8,)).cuda()}
    seen = []
    for _ in range(4):
        out = model(**batch)
        seen.append(a100.phases.steps)
        out["loss"].backward()
        opt.step()
        opt.zero_grad()
    # every call opens a training step (before the fix no module had a positional tensor: no step was ever seen)
    assert seen == [1, 2, 3, 4]
    assert a100.replay is not None
    # calls 1 and 2 record, 3 and 4 replay (the same counts as a positional call, test_replay.py)
    assert (a100.replay.recorded, a100.replay.replayed) == (2, 2)
    assert a100.phases.pending_kwargs is None  # the batch is not kept alive by the tracker


def test_cuda_graph_classes_survive_import_time_use(a100: gt.Emulation) -> None:
    # transformers' continuous batching annotates `def get_graph(...) -> torch.cuda.CUDAGraph | None` at import
    hint = torch.cuda.CUDAGraph | None
    assert torch.cuda.CUDAGraph in hint.__args__
    assert issubclass(type("Graphs", (torch.cuda.CUDAGraph,), {}), torch.cuda.CUDAGraph)


def test_conv_with_bias_on_a_16_bit_input_under_autocast(a100: gt.Emulation) -> None:
    conv = nn.Conv2d(8, 8, 3, padding=1).cuda()  # bias=True, as in ConvNeXt
    x = torch.randn(2, 8, 16, 16, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        y = conv(x)
        z = conv(y)  # y is float16 and the bias float32: torch.conv2d's own check rejected this before the fix
        w = nn.functional.conv1d(torch.randn(2, 8, 16, device="cuda").half(), torch.randn(4, 8, 3, device="cuda"),
                                 torch.randn(4, device="cuda"))
    assert (y.dtype, z.dtype, w.dtype) == (torch.float16, torch.float16, torch.float16)
    z.float().sum().backward()
    assert conv.bias.grad is not None and conv.bias.grad.dtype == torch.float32  # the master bias stays fp32
    with pytest.raises(RuntimeError, match="bias type"):  # outside autocast torch's check stands
        conv(y)


def test_masks_built_from_host_values_read_back_their_real_values(a100: gt.Emulation) -> None:
    from torch.nn.modules.transformer import _detect_is_causal_mask

    # word_language_model: the mask is built on the host and copied; TransformerEncoder compares it with a causal
    # mask it builds on the device (torch.full + triu) and reads `(mask == causal).all()` back
    causal = nn.Transformer.generate_square_subsequent_mask(35).cuda()
    assert _detect_is_causal_mask(causal) is True  # read as False (zeros) before: the explicit-mask path ran
    assert _detect_is_causal_mask(torch.zeros(35, 35).cuda()) is False  # a mask that is not causal stays so
    assert torch.equal(causal, nn.Transformer.generate_square_subsequent_mask(35, device="cuda"))
    # transformers' sdpa_mask drops the mask when `padding_mask.all()`: true only without padding
    padded = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]).cuda()
    assert bool(padded.bool().all()) is False  # the all() default (True) answered before
    assert bool(torch.ones(2, 4, dtype=torch.long).cuda().bool().all()) is True
    from gpemu.torch_backend.ops import known_sources

    assert len(known_sources(padded)) == 1 and known_sources(padded.bool()) == known_sources(padded)  # one copy
    assert known_sources(torch.arange(4, device="cuda") + 1) == frozenset()  # a constant: depends on no input
    # positions from arange through a comparison and a sum: 4 of the 16 pairs have j >= 3
    pos = torch.arange(4, device="cuda")
    assert int((pos[None, :] >= pos.new_full((4, 1), 3)).sum()) == 4
    # a model's math stays unknown: a weight over KNOWN_VALUE_MAX_BYTES (256 * 128 * 4 B = 128 KiB) is not copied
    # with its value, so nothing computed from it has one
    lin = nn.Linear(256, 128).cuda()
    assert lin(torch.ones(1, 256).cuda())[0, :2].tolist() == [0.0, 0.0]
    # and a small parameter, copied with its value, never passes it on: parameters are the model's math
    small = nn.Linear(4, 4).cuda()
    assert (small.bias * 2).tolist() == [0.0] * 4
    assert small(torch.ones(1, 4).cuda()).tolist() == [[0.0] * 4]


class _PadAware(nn.Module):
    """Reads `attention_mask.all()` on the host in forward and masks only when there is padding (transformers)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(256, 256)  # 256 KiB of weights: its math is not computed

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if not bool(attention_mask.bool().all()):
            h = h * attention_mask[..., None]
        return h


def _steps(model: nn.Module, masks: list[torch.Tensor]) -> list[int]:
    """Run one forward/backward per mask; return the D2H bytes each step copied."""
    emu = gt.current_emulation()
    assert emu is not None
    stats = emu.devices[0].stats
    x = torch.randn(4, 8, 256, device="cuda")
    out = []
    for m in masks:
        before = stats.d2h_bytes
        model(x, m).sum().backward()
        out.append(stats.d2h_bytes - before)
    return out


def test_a_forward_that_reads_a_fixed_mask_replays_with_its_read(a100: gt.Emulation) -> None:
    model = _PadAware().cuda()
    mask = torch.ones(4, 8, dtype=torch.long).cuda()
    copied = _steps(model, [mask] * 4)
    assert a100.replay is not None
    assert (a100.replay.recorded, a100.replay.replayed) == (2, 2)  # before: a read in forward was never replayed
    # every step, replayed or not, copies the 1-byte all() result and the loss is not read: 1 byte per step
    assert copied == [1, 1, 1, 1]


def test_a_forward_whose_read_depends_on_each_batch_is_keyed_by_its_values(a100: gt.Emulation) -> None:
    model = _PadAware().cuda()
    full = torch.ones(4, 8, dtype=torch.long)
    padded = full.clone()
    padded[0, 5:] = 0
    masks = [m.cuda() for m in (full, padded, full, padded, full, padded, full)]
    _steps(model, masks)
    assert a100.replay is not None
    # call 1 learns that the read depends on the mask, and each answer it reads is its own key: full (True)
    # records at calls 1 and 3 and replays at 5 and 7, padded (False) records at 2 and 4 and replays at 6
    assert (a100.replay.recorded, a100.replay.replayed) == (4, 3)
    # a replayed step takes the path its mask takes per op: the padded step's extra multiply is in its recording
    ready = {id(e.ready): e.ready for e in a100.replay.entries[model].values() if e.ready is not None}
    ops = sorted(len(r.fwd) for r in ready.values())
    assert len(ops) == 2 and ops[1] == ops[0] + 1


def test_a_forward_whose_masks_differ_but_read_the_same_answer_replays(a100: gt.Emulation) -> None:
    # every batch pads a different tail (a data collator padding to max_length): the masks all differ, but
    # `attention_mask.all()` reads False for each, so each runs the same ops (Note [Read programs])
    model = _PadAware().cuda()
    masks = []
    for step in range(6):
        m = torch.ones(4, 8, dtype=torch.long)
        m[step % 4, 7 - step % 3:] = 0
        masks.append(m)
    assert len({tuple(m.flatten().tolist()) for m in masks}) == 6
    copied = _steps(model, [m.cuda() for m in masks])
    assert a100.replay is not None
    # keyed by the input digests (before), all 6 calls recorded; keyed by what the read reads: calls 1-2 record,
    # 3-6 replay
    assert (a100.replay.recorded, a100.replay.replayed) == (2, 4)
    assert copied == [1] * 6  # each step still copies its 1-byte all() result
    # the replayed path is the padded one: its recording has the extra multiply of an unpadded call's forward + 1
    ready = [e.ready for e in a100.replay.entries[model].values() if e.ready is not None]
    assert len({id(r) for r in ready}) == 1
    full = _PadAware().cuda()
    _steps(full, [torch.ones(4, 8, dtype=torch.long).cuda()] * 3)
    full_ready = next(e.ready for e in a100.replay.entries[full].values() if e.ready is not None)
    assert len(ready[0].fwd) == len(full_ready.fwd) + 1


def test_a_count_read_is_recomputed_for_each_batch(a100: gt.Emulation) -> None:
    class Counted(nn.Module):  # branches on a count of the mask read on the host (item of a sum)
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(256, 256)

        def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            h = self.lin(x)
            if int(attention_mask.sum()) < attention_mask.numel():
                h = h * attention_mask[..., None]
            return h

    model = Counted().cuda()
    full = torch.ones(4, 8, dtype=torch.long)
    padded = [full.clone() for _ in range(3)]
    for i, m in enumerate(padded):
        m[i, 6:] = 0
    _steps(model, [m.cuda() for m in (padded[0], padded[1], padded[2], padded[0], padded[1])])
    assert a100.replay is not None
    # sum() is recomputed too: every padded mask sums to 30 (two zeros each), so calls 1-2 record, 3-5 replay
    assert (a100.replay.recorded, a100.replay.replayed) == (2, 3)


def test_transformer_encoder_with_a_causal_mask_replays(a100: gt.Emulation) -> None:
    class LM(nn.Module):  # pytorch/examples word_language_model: the mask is an attribute, built once
        def __init__(self) -> None:
            super().__init__()
            self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0), 2,
                                             enable_nested_tensor=False)
            self.src_mask = nn.Transformer.generate_square_subsequent_mask(35).cuda()

        def forward(self, src: torch.Tensor) -> torch.Tensor:
            return self.enc(src, mask=self.src_mask)

    model = LM().cuda()
    src = torch.randn(35, 4, 64, device="cuda")
    for _ in range(4):
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(src)
        out.float().sum().backward()
    assert a100.replay is not None
    # before: the encoder's mask check read the host every forward, so no call was ever replayed
    assert (a100.replay.recorded, a100.replay.replayed) == (2, 2)
    rec = next(e.ready for e in a100.replay.entries[model].values() if e.ready is not None)
    assert [r[2] for r in rec.reads] == ["tensor.item()"]  # the encoder checks the mask once for all layers
    # the mask reads as causal (it read as all zeros before), so attention runs as flash attention with
    # is_causal=True, not the efficient kernel with an explicit mask
    names = {name for name, _s, _c in rec.fwd}
    assert "_scaled_dot_product_flash_attention.default" in names
    assert "_scaled_dot_product_efficient_attention.default" not in names


class _CacheLike(nn.Module):
    """Starts an empty tensor on the device each forward (transformers' DynamicLayer) and returns constants."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None, int]:
        keys = torch.tensor([], device=x.device)  # an empty host copy: torch copies nothing
        return torch.cat([keys, self.lin(x).flatten()]), None, 3


def test_empty_host_copies_are_free_and_constant_outputs_replay(a100: gt.Emulation) -> None:
    stats = a100.devices[0].stats
    works, waits = sum(stats.work_count.values()), sum(stats.host_wait_s.values())
    torch.tensor([], device="cuda")
    # no copy was queued and the host did not wait (before: a pageable copy of 0 bytes, which waited for the GPU)
    assert (sum(stats.work_count.values()), sum(stats.host_wait_s.values())) == (works, waits)
    model = _CacheLike().cuda()
    x = torch.randn(4, 256, device="cuda")
    outs = []
    for _ in range(4):
        out = model(x)
        out[0].sum().backward()
        outs.append(out)
    assert a100.replay is not None and (a100.replay.recorded, a100.replay.replayed) == (2, 2)
    assert outs[-1][1:] == (None, 3) and tuple(outs[-1][0].shape) == (1024,)  # 4 * 256


def test_gpt2_training_forward_replays_with_its_cache(a100: gt.Emulation) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64)
    model = transformers.GPT2LMHeadModel(config).cuda()
    ids = torch.randint(0, 512, (2, 64)).cuda()
    outs = []
    for _ in range(4):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        outs.append(out)
    assert a100.replay is not None
    # the forward builds a DynamicCache (use_cache) from torch.tensor([]) copies and returns it: it recorded but
    # never replayed before
    assert (a100.replay.recorded, a100.replay.replayed) == (2, 2)
    cache = outs[-1].past_key_values
    if not isinstance(cache, transformers.DynamicCache):  # transformers < 4.56 hands back the legacy format: per
        # layer a (key, value) pair of (batch 2, heads 4, 64 tokens, 64 / 4 = 16) tensors, also on a replayed call
        assert len(cache) == 2 and all(tuple(t.shape) == (2, 4, 64, 16) for kv in cache for t in kv)
    assert tuple(outs[-1].logits.shape) == (2, 64, 512)


def test_bert_with_a_fixed_attention_mask_replays(a100: gt.Emulation) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=512)
    model = transformers.BertForSequenceClassification(config).cuda()
    batch = {"input_ids": torch.randint(0, 512, (4, 32)).cuda(), "attention_mask": torch.ones(4, 32).long().cuda(),
             "labels": torch.randint(0, 2, (4,)).cuda()}
    for _ in range(4):
        model(**batch).loss.backward()
    assert a100.replay is not None
    # model(**batch) (keyword tensors) and `padding_mask.all()` in forward both stopped replay before
    assert (a100.replay.recorded, a100.replay.replayed) == (2, 2)


def test_timm_convnext_amp_step(a100: gt.Emulation) -> None:
    timm = pytest.importorskip("timm")
    model = timm.create_model("convnext_atto", pretrained=False, num_classes=10).cuda()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(2, 3, 64, 64, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).float().mean()  # its convolutions have biases and take 16-bit inputs after the stem
    loss.backward()
    opt.step()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


def _hard_sigmoid_bwd(x: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    m = torch.ones_like(x) * ((x >= -3.0) & (x <= 3.0)) / 6.0  # timm 0.6's activations_me, scripted at import
    return grad_output * m


def test_torchscript_compiles_functions_that_call_patched_torch_functions(a100: gt.Emulation) -> None:
    scripted = torch.jit.script(_hard_sigmoid_bwd)  # failed: torch.ones_like is gpemu's Python wrapper
    x = torch.randn(4, 8, device="cuda")
    out = scripted(x, torch.randn(4, 8, device="cuda"))
    assert out.is_cuda and tuple(out.shape) == (4, 8)
    from torch.jit._builtins import _get_builtin_table

    assert _get_builtin_table()[id(torch.ones_like)] == "aten::ones_like"
    gt.uninstall()
    assert id(torch.ones_like) in _get_builtin_table()  # the original is there again; the wrapper's entry is gone
    gt.install("a100")


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(256, 256)
        self.l2 = nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.relu(self.l1(x)))


class _Checkpointed(nn.Module):
    """Two blocks under activation checkpointing (gradient_checkpointing_enable() in transformers)."""

    def __init__(self) -> None:
        super().__init__()
        self.b1, self.b2 = _Block(), _Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        h = checkpoint(self.b1, x, use_reentrant=False)
        return checkpoint(self.b2, h, use_reentrant=False)


def _step_busy_s(emu: gt.Emulation, model: nn.Module, x: torch.Tensor, steps: int) -> list[float]:
    """Run `steps` forward/backward steps; return the GPU compute busy seconds of each."""
    dev = emu.devices[0]
    busy = []
    for _ in range(steps):
        torch.cuda.synchronize()
        before = dev.busy_s()
        model(x).sum().backward()
        torch.cuda.synchronize()
        busy.append(dev.busy_s() - before)
    return busy


def test_activation_checkpointing_recomputes_inside_the_step(a100: gt.Emulation) -> None:
    model = _Checkpointed().cuda()
    x = torch.randn(64, 256, device="cuda", requires_grad=True)
    busy = _step_busy_s(a100, model, x, 4)
    # the blocks' forwards run again in backward; that was a new step each (5 steps for 4) and the blocks were
    # recorded as top modules, so the model never replayed
    assert a100.phases.steps == 4
    assert a100.replay is not None and (a100.replay.recorded, a100.replay.replayed) == (2, 2)
    assert list(a100.replay.entries.keys()) == [model]
    # a replayed step charges what the recorded one did, recomputation included (chunked sums: float rounding only)
    assert busy[3] == pytest.approx(busy[1], rel=1e-6)


def test_a_transformers_input_grad_hook_does_not_stop_replay(a100: gt.Emulation) -> None:
    # transformers' gradient_checkpointing_enable() registers this hook on the input embeddings (same name, same
    # body; its __module__ is transformers'), which kept a checkpointed model on the per-op path
    def make_inputs_require_grads(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        output.requires_grad_(True)

    hook = make_inputs_require_grads
    hook.__module__ = "transformers.modeling_utils"
    model = _Checkpointed().cuda()
    model.b1.register_forward_hook(hook)
    x = torch.randn(64, 256, device="cuda")
    busy = _step_busy_s(a100, model, x, 4)
    assert a100.replay is not None and (a100.replay.recorded, a100.replay.replayed) == (2, 2)
    assert busy[3] == pytest.approx(busy[1], rel=1e-6)  # the replayed step charges the recorded one
    # any other hook (it could change the step) keeps the model on the per-op path
    other = _Checkpointed().cuda()
    other.b1.register_forward_hook(lambda m, a, o: None)
    for _ in range(3):
        other(x).sum().backward()
    assert (a100.replay.recorded, a100.replay.replayed) == (2, 2)


def test_bert_with_gradient_checkpointing_replays(a100: gt.Emulation) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=512)
    model = transformers.BertForSequenceClassification(config).cuda()
    model.gradient_checkpointing_enable()
    model.train()
    batch = {"input_ids": torch.randint(0, 512, (4, 32)).cuda(), "attention_mask": torch.ones(4, 32).long().cuda(),
             "labels": torch.randint(0, 2, (4,)).cuda()}
    for _ in range(4):
        model(**batch).loss.backward()
    assert a100.replay is not None
    assert (a100.replay.recorded, a100.replay.replayed) == (2, 2)  # (4, 0) before: the input-grad hook


def test_storages_have_distinct_addresses_shared_by_their_views(a100: gt.Emulation) -> None:
    a = torch.zeros(8, device="cuda")
    b = torch.zeros(8, device="cuda")
    pa, pb = a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr()
    assert pa != 0 and pb != 0 and pa != pb  # all 0 before: every emulated tensor "shared" one storage
    assert a.detach().untyped_storage().data_ptr() == pa  # a state_dict entry and its tensor
    assert a[2:].data_ptr() == a.data_ptr() + 8  # offset 2 float32 elements = 8 bytes
    # the safetensors / transformers grouping: tied weights share, other parameters do not
    emb = nn.Embedding(16, 8).cuda()
    head = nn.Linear(8, 16, bias=False).cuda()
    head.weight = emb.weight
    groups: dict[tuple[int, int], list[str]] = {}
    for name, t in {"emb": emb.weight.detach(), "head": head.weight.detach(), "a": a, "b": b}.items():
        groups.setdefault((t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()), []).append(name)
    assert sorted(groups.values()) == [["a"], ["b"], ["emb", "head"]]


def test_save_pretrained_and_from_pretrained_round_trip(a100: gt.Emulation, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=32)
    model = transformers.GPT2LMHeadModel(config).cuda()
    model.save_pretrained(tmp_path)  # raised "contained shared tensors" for every same-sized group of parameters
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "transformer.wte.weight" in keys and "lm_head.weight" not in keys  # the tied head is saved once
    pytest.importorskip("accelerate")  # transformers' device_map= loading needs it (4.52 and 5.24 alike)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, device_map="cuda")
    assert next(loaded.parameters()).is_cuda


def _accumulate(replay: bool, micro_steps: int) -> tuple[list[float], list[int], gt.Emulation]:
    """Train with 2 micro-steps per optimizer step; return per-micro-step busy seconds and peaks, and the emulation."""
    emu = gt.install("a100", replay=replay)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 512, device="cuda")
    dev = emu.devices[0]
    busy, peaks = [], []
    for i in range(micro_steps):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = dev.busy_s()
        (model(x).sum() / 2).backward()
        if i % 2 == 1:
            opt.step()
            opt.zero_grad()  # set_to_none: the next micro-step creates the gradients again
        torch.cuda.synchronize()
        busy.append(dev.busy_s() - before)
        peaks.append(torch.cuda.max_memory_allocated())
    return busy, peaks, emu


def test_gradient_accumulation_replays_both_kinds_of_micro_step() -> None:
    try:
        busy_op, peaks_op, _ = _accumulate(False, 8)
    finally:
        gt.uninstall()
    try:
        busy, peaks, emu = _accumulate(True, 8)
        assert emu.replay is not None
        # micro-steps alternate: without .grad (creates them) and with (adds into them); their backward peaks
        # differ, so no recording matched its predecessor and nothing replayed. Now calls 1 and 2 record (one of
        # each kind) and 3..8 replay
        assert (emu.replay.recorded, emu.replay.replayed) == (2, 6)
    finally:
        gt.uninstall()
    assert busy[2:] == pytest.approx(busy_op[2:], rel=1e-6)  # replayed micro-steps charge what per-op ones did
    # and reach the same peaks, each kind its own, up to one 512-byte allocator block (a bias gradient rounds
    # apart); a replayed micro-step that adds into existing gradients makes them one at a time (all at once: 1 MiB
    # higher, the second weight's gradient)
    assert all(abs(a - b) <= 512 for a, b in zip(peaks[2:], peaks_op[2:], strict=True))
    assert peaks_op[1] - peaks_op[0] > 2**20  # the kinds differ by more than that: 5647872 - 4465664 bytes


def test_detached_labels_keep_their_values(a100: gt.Emulation) -> None:
    labels = torch.tensor([0, 1, 1, 0]).cuda()
    # the Trainer's evaluation: nested_detach(labels), concatenated across batches, then .cpu().numpy()
    gathered = torch.cat([labels.detach(), labels.detach()])
    assert gathered.cpu().tolist() == [0, 1, 1, 0, 0, 1, 1, 0]  # read as zeros before (accuracy 1.0)


def test_a_generate_loop_stops_at_its_max_length(a100: gt.Emulation) -> None:
    # transformers' generate(): `unfinished &= ~(max_length_reached | eos_seen)` until `unfinished.max() == 0`; the
    # EOS check reads generated tokens (not computed), which made the whole chain unknown and read False forever
    # (Note [Absorbing operands])
    head = nn.Linear(64, 100).cuda()
    hidden = torch.randn(2, 64, device="cuda")
    unfinished = torch.ones(2, dtype=torch.long, device="cuda")
    steps, max_new_tokens = 0, 5
    while True:
        tokens = head(hidden).argmax(-1)
        eos = torch.isin(tokens, torch.tensor([2], device="cuda"))
        done = torch.full((2,), steps + 1 >= max_new_tokens, dtype=torch.bool, device="cuda") | eos
        unfinished = unfinished & ~done
        steps += 1
        if bool(unfinished.max() == 0) or steps >= 50:
            break
    assert steps == max_new_tokens  # 50 before: the loop never stopped by itself
    # an all-False operand of & and an all-True one of | decide the result; otherwise it stays unknown
    unknown = head(hidden).argmax(-1) == 3
    assert (unknown & torch.zeros(2, dtype=torch.bool, device="cuda")).tolist() == [False, False]
    assert (torch.ones(2, dtype=torch.bool, device="cuda") | unknown).tolist() == [True, True]
    from gpemu.torch_backend.ops import known_value

    assert known_value(unknown | torch.zeros(2, dtype=torch.bool, device="cuda")) is None  # False decides no |


def test_t5_with_its_encoder_decoder_cache_replays(a100: gt.Emulation) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=512,
                                   decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(config).cuda().train()
    batch = {"input_ids": torch.randint(5, 512, (4, 24)).cuda(), "attention_mask": torch.ones(4, 24).long().cuda(),
             "labels": torch.randint(5, 512, (4, 8)).cuda()}
    for _ in range(4):
        out = model(**batch)
        out.loss.backward()
    assert a100.replay is not None
    assert (a100.replay.recorded, a100.replay.replayed) == (2, 2)  # (4, 0) before: the EncoderDecoderCache output
    # a new, empty one on replay; transformers < 4.56 hands back the legacy format, per decoder layer the self- and
    # cross-attention (key, value) tensors, 4 each
    assert type(out.past_key_values).__name__ == "EncoderDecoderCache" or (
        isinstance(out.past_key_values, tuple) and [len(layer) for layer in out.past_key_values] == [4, 4])


def test_beam_search_runs_to_its_max_length(a100: gt.Emulation) -> None:
    # transformers >= 4.50's vectorised beam search stops when `improvement_possible & exists_open_beam &
    # valid_continuations` reads False, and crops its output to a length counted from the beam indices; all of it
    # derives from generated tokens and scores, which are not computed (Note [Beam search under emulation])
    transformers = pytest.importorskip("transformers")
    utils = pytest.importorskip("transformers.generation.utils")
    if not hasattr(utils.GenerationMixin, "_beam_search_has_unfinished_sequences"):
        pytest.skip("transformers < 4.50: beam search is BeamSearchScorer's host loop")
    config = transformers.T5Config(d_model=32, d_ff=64, num_layers=1, num_heads=2, vocab_size=64,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = transformers.T5ForConditionalGeneration(config).cuda().eval()
    calls = []
    model.decoder.register_forward_pre_hook(lambda m, a: calls.append(1))
    input_ids = torch.randint(3, 64, (2, 7)).cuda()
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, num_beams=4, max_length=10, do_sample=False)
    # EOS is never seen (as in greedy search): 9 decoder steps after the start token, and the 10-token sequences
    # (decoder start + 9) come back whole
    assert len(calls) == 9  # 1 before: the first stop check read False
    assert tuple(out.shape) == (2, 10)  # (2, 0) before: the crop read a length of 0


@dataclasses.dataclass
class _OldModelOutput(collections.OrderedDict):  # type: ignore[type-arg]
    """transformers <= 4.34's ModelOutput: an OrderedDict dataclass holding its non-None fields, not a pytree node."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None

    def __post_init__(self) -> None:
        for name in ("loss", "logits"):
            if getattr(self, name) is not None:
                self[name] = getattr(self, name)


class _OldStyleClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(32, 4)

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> _OldModelOutput:
        logits = self.head(pixel_values)
        return _OldModelOutput(loss=nn.functional.cross_entropy(logits, labels), logits=logits)


def test_a_model_output_pytree_does_not_know_replays(a100: gt.Emulation) -> None:
    # Note [Model outputs pytree does not know]: 4 steps record twice, then replay twice (0 replays before: the whole
    # output was one leaf that is neither a tensor nor a constant)
    model = _OldStyleClassifier().cuda()
    batch = {"pixel_values": torch.randn(8, 32).cuda(), "labels": torch.randint(0, 4, (8,)).cuda()}
    for _ in range(4):
        out = model(**batch)
        out["loss"].backward()
    assert a100.replay is not None
    assert (a100.replay.recorded, a100.replay.replayed) == (2, 2)
    assert type(out) is _OldModelOutput and list(out.keys()) == ["loss", "logits"]
    assert tuple(out.logits.shape) == (8, 4) and out.loss.requires_grad


def test_read_answers_leave_sanity_checks_and_known_values_alone(a100: gt.Emulation) -> None:
    # the answers a library routine supplies (Note [Beam search under emulation]) cover computed values only: an
    # any() check still reads False ("nothing flagged"), a known value its own value
    from gpemu.torch_backend.ops import read_answers

    head = nn.Linear(8, 4).cuda()
    scores = head(torch.randn(2, 8, device="cuda"))
    with read_answers(lambda shape, dtype, reason: True if dtype == torch.bool else None):
        assert bool(scores.sum() > 0)  # computed: the routine's answer (False, the default zeros, outside)
        assert not bool(torch.isnan(scores).any())  # a sanity check keeps its passing answer
        assert not bool(torch.zeros(2, dtype=torch.bool, device="cuda").any())  # known: its value
    assert not bool(scores.sum() > 0)
