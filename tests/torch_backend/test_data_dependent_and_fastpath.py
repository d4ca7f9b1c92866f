"""Ops real scripts use whose output size or pricing needs a policy: bincount, repeat_interleave, unique, allclose,
and the nn.Transformer eval fast path."""

from __future__ import annotations

import pytest
import torch

import gpemu.torch_backend as gt
from gpemu.errors import UnsupportedOpError
from gpemu.torch_backend import tensor as tensor_mod


def test_bincount_with_minlength_is_the_confusion_matrix_idiom(emu: gt.Emulation) -> None:
    n = 5
    target = torch.randint(0, n, (64,), device="cuda")
    pred = torch.randint(0, n, (64,), device="cuda")
    k = (target >= 0) & (target < n)
    hist = torch.bincount(n * target[k] + pred[k], minlength=n**2).reshape(n, n)  # vision segmentation ConfusionMatrix
    assert hist.shape == (5, 5) and hist.dtype == torch.long
    weighted = torch.bincount(target, torch.ones(64, device="cuda"), 8)
    assert weighted.shape == (8,) and weighted.dtype == torch.float32


def test_value_sized_ops_fail_with_a_workaround(emu: gt.Emulation) -> None:
    x = torch.randint(0, 5, (8,), device="cuda")
    with pytest.raises(UnsupportedOpError, match="minlength="):
        torch.bincount(x)
    with pytest.raises(UnsupportedOpError, match="output_size="):
        torch.randn(8, 3, device="cuda").repeat_interleave(x, dim=0)
    # with the size given, it runs: 20 rows
    assert torch.randn(8, 3, device="cuda").repeat_interleave(x, dim=0, output_size=20).shape == (20, 3)


def test_unique_answers_on_the_values_a_read_returns(emu: gt.Emulation) -> None:
    # Note [Unique on read values]: labels copied from the host are known, so unique is the real answer
    y = torch.tensor([3, 1, 3, 7, 1]).cuda()
    values, inverse, counts = torch.unique(y, return_inverse=True, return_counts=True)
    assert values.is_cuda and values.cpu().tolist() == [1, 3, 7]  # sorted distinct labels
    assert inverse.cpu().tolist() == [1, 0, 1, 2, 0] and counts.cpu().tolist() == [2, 2, 1]
    # computed labels read as zeros (as `.cpu().unique()` would see them): one value, counted 64 times
    preds = (torch.randn(64, 10, device="cuda") @ torch.randn(10, 10, device="cuda")).argmax(-1)
    values, counts = torch.unique(preds, return_counts=True)
    assert values.shape == (1,) and counts.cpu().tolist() == [64]
    assert torch.unique_consecutive(preds).shape == (1,)
    assert torch.unique(torch.randn(4, 3, device="cuda"), dim=0).shape == (1, 3)  # four equal (zero) rows
    assert emu.devices[0].clock.now() >= emu.current_stream(0).t_done  # the count reached the host: it waited


def test_torchmetrics_label_validation_runs(emu: gt.Emulation) -> None:
    # torchmetrics checks `len(torch.unique(t)) > num_classes` for integer preds and target (validate_args=True);
    # Lightning Fabric's build_your_own_trainer example calls it every step (raised UnsupportedOpError before)
    functional = pytest.importorskip("torchmetrics.functional")
    logits = torch.randn(64, 10, device="cuda")
    target = torch.randint(0, 10, (64,)).cuda()
    acc = functional.accuracy(logits.argmax(-1), target, task="multiclass", num_classes=10, top_k=1)
    assert acc.is_cuda and acc.shape == ()


def test_allclose_answers_true_after_waiting(emu: gt.Emulation) -> None:
    x = torch.randn(1024, 1024, device="cuda")
    y = x @ x  # queue real work so the host read has something to wait for
    assert torch.allclose(y, y) is True
    assert emu.devices[0].clock.now() >= emu.current_stream(0).t_done  # the host waited for the matmul


def test_transformer_eval_runs_the_standard_path_priced_per_op(emu: gt.Emulation, monkeypatch) -> None:
    d_model, ff, batch, seq = 256, 1024, 8, 128
    layer = torch.nn.TransformerEncoderLayer(d_model, 4, ff, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 1).cuda().eval()  # enable_nested_tensor defaults to True
    x = torch.randn(batch, seq, d_model, device="cuda")
    mask = torch.zeros(batch, seq, dtype=torch.bool, device="cuda")
    charged: list[tuple[str, float]] = []
    orig = tensor_mod.charge

    def spy(index: int, func: object, cost_s: float, *args: object, **kwargs: object) -> None:
        charged.append((func if isinstance(func, str) else func.__name__, cost_s))  # type: ignore[attr-defined]
        orig(index, func, cost_s, *args, **kwargs)

    monkeypatch.setattr(tensor_mod, "charge", spy)
    with torch.no_grad():
        out = encoder(x, src_key_padding_mask=mask)  # the nested-tensor fast path had no meta kernel: it raised
    assert out.shape == (8, 128, 256)
    names = {n for n, _ in charged}
    assert not any(n.startswith(("_transformer_encoder_layer_fwd", "_native_multi_head_attention")) for n in names)
    # linear FLOPs: 2 * tokens * (d*3d + d*d + 2*d*ff) = 2 * 1024 * (196608 + 65536 + 524288) = 1.61e9; at the A100's
    # fp32 peak (19.5 TFLOP/s) that is >= 0.083 ms; the fused op used to be priced as memory traffic only
    flops = 2 * batch * seq * (3 * d_model**2 + d_model**2 + 2 * d_model * ff)
    assert sum(c for _, c in charged) >= flops / (emu.devices[0].spec.peak_tflops["fp32"] * 1e12)


def test_torchvision_nms_keeps_the_assumed_fraction() -> None:
    torchvision = pytest.importorskip("torchvision")
    gt.install("v100", nonzero_fraction=0.25)
    try:
        boxes = torch.rand(40, 4, device="cuda")
        keep = torchvision.ops.nms(boxes, torch.rand(40, device="cuda"), 0.5)
        assert keep.shape == (10,) and keep.dtype == torch.long  # ceil(40 * 0.25)
    finally:
        gt.uninstall()


def test_detection_model_trains_and_evaluates(emu: gt.Emulation) -> None:
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=5
    ).cuda()
    images = [torch.rand(3, 200, 240).cuda() for _ in range(2)]
    targets = [{"boxes": torch.tensor([[10.0, 20.0, 100.0, 120.0]]).cuda(), "labels": torch.tensor([1]).cuda()}] * 2
    losses = model(images, targets)  # RPN and ROI heads: nms, box sampling by masks (torchvision references/detection)
    assert sorted(losses) == ["loss_box_reg", "loss_classifier", "loss_objectness", "loss_rpn_box_reg"]
    sum(losses.values()).backward()
    assert model.roi_heads.box_predictor.cls_score.weight.grad is not None
    model.eval()
    with torch.no_grad():
        detections = model(images)
    assert detections[0]["boxes"].shape == (100, 4)  # worst case: detections_per_img (100) boxes kept


def test_masks_scattered_into_zeros_select_at_most_what_was_written(emu: gt.Emulation) -> None:
    # torchvision's BalancedPositiveNegativeSampler on 2,002 proposals (Note [Nonzero bounds]): 128 positive and
    # 384 negative indices scattered into zeros_like masks; `where(pos | neg)` selects at most 128 + 384 = 512, where
    # the worst-case fraction (1.0) selected all 2,002 before
    matched = torch.rand(2002, device="cuda").long()  # computed: values unknown
    positive, negative = torch.where(matched >= 1)[0], torch.where(matched == 0)[0]
    assert positive.shape == (2002,)  # unknown values: the worst case
    masks = []
    for idx, k in ((positive, 128), (negative, 384)):
        mask = torch.zeros_like(matched, dtype=torch.uint8)
        mask[idx[torch.randperm(idx.numel(), device="cuda")[:k]]] = 1
        masks.append(mask)
    pos, neg = masks
    assert torch.where(pos | neg)[0].shape == (512,)
    assert torch.where(torch.cat([pos, neg]))[0].shape == (512,)  # the RPN's form
    assert matched[pos.bool()].shape == (128,) and torch.masked_select(matched, neg.bool()).shape == (384,)
    assert torch.where(pos & neg)[0].shape == (128,)  # at most the smaller bound
    big = torch.zeros(200_000, dtype=torch.uint8, device="cuda")  # over 64 KiB: no known value, still a bound
    big[positive[:256]] = 1
    assert torch.where(big)[0].shape == (256,)
    rows = torch.zeros(100, 4, device="cuda")
    rows[positive[:3]] = 1.0  # 3 rows of 4 elements
    assert torch.nonzero(rows).shape == (12, 2)
    big.add_(1)  # any other in-place change forgets the bound
    assert torch.where(big)[0].shape == (200_000,)
    acc = torch.zeros(1000, device="cuda")
    acc.index_put_((positive[:10],), torch.ones(10, device="cuda"), accumulate=True)
    assert torch.nonzero(acc).shape == (1000, 1)  # accumulate: no bound kept (the prior value is added to)


def test_softmax_scores_over_a_threshold_are_bounded_by_their_mass(emu: gt.Emulation) -> None:
    # torchvision's RoIHeads.postprocess_detections (Note [Softmax mass]): softmax over 1,000 proposals x 91 classes,
    # the background column dropped, flattened (a non-contiguous reshape: clone + _unsafe_view) and thresholded at
    # 0.05. The 1,000 rows sum to 1,000, so at most 1,000 / 0.05 = 20,000 of the 90,000 scores exceed 0.05; the
    # worst-case fraction selected all 90,000 before
    logits = torch.randn(1000, 91, device="cuda")
    for mode in (torch.no_grad, torch.inference_mode):  # inference mode dispatches the views as ops
        with mode():
            scores = torch.softmax(logits, -1).split([600, 400], 0)[0][:, 1:].reshape(-1)
            assert scores.shape == (54_000,)
            # a part holds at most the whole's mass (1,000; not its own 600 rows): 1,000 / 0.05 = 20,000 of 54,000
            assert torch.where(scores > 0.05)[0].shape == (20_000,)
            full = torch.nn.functional.softmax(logits, -1)[:, 1:].reshape(-1)
            assert torch.where(full > 0.05)[0].shape == (20_000,)
            assert torch.where(full >= 0.5)[0].shape == (2_000,)  # >=: at most 1,000 / 0.5
            assert torch.where(torch.cat([full, full]) > 0.05)[0].shape == (40_000,)  # cat: the masses add
            assert torch.where(full > 0.0)[0].shape == (90_000,)  # no positive threshold: no bound
            assert torch.where(logits.reshape(-1) > 0.05)[0].shape == (91_000,)  # logits: no mass
    probs = torch.softmax(logits, -1)
    probs.mul_(100)  # an in-place change forgets the mass
    assert torch.where(probs > 0.05)[0].shape == (91_000,)
    expanded = torch.softmax(logits[:1], -1).expand(1000, 91).reshape(-1)  # expand repeats elements: no bound
    assert torch.where(expanded > 0.05)[0].shape == (91_000,)


def test_faster_rcnn_evaluation_nms_runs_on_the_bounded_detections(emu: gt.Emulation) -> None:
    torchvision = pytest.importorskip("torchvision")
    import gpemu.torch_backend.ops as ops

    model = torchvision.models.detection.fasterrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=91, min_size=128, max_size=160).cuda().eval()
    sizes: list[int] = []
    nms = ops.DATA_DEPENDENT_BY_NAME["torchvision::nms"]

    def spy(func, args, kwargs):  # type: ignore[no-untyped-def]
        sizes.append(args[0].shape[0])
        return nms(func, args, kwargs)

    ops.DATA_DEPENDENT_BY_NAME["torchvision::nms"] = spy
    try:
        with torch.inference_mode():  # as torchvision's references/detection evaluate() runs it
            model([torch.rand(3, 128, 160, device="cuda")])
    finally:
        ops.DATA_DEPENDENT_BY_NAME["torchvision::nms"] = nms
    # the RPN's NMS, then postprocess_detections' over the boxes scoring above box_score_thresh 0.05: at most
    # 1,000 proposals (rpn_post_nms_top_n_test) / 0.05 = 20,000, where all 1,000 x 90 = 90,000 ran before
    assert sizes[-1] == 20_000


def test_mask_rcnn_heads_run_on_the_sampled_rois(emu: gt.Emulation) -> None:
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.detection.maskrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=2, min_size=128, max_size=160, rpn_post_nms_top_n_train=1000
    ).cuda()
    rois: list[int] = []
    model.roi_heads.box_head.register_forward_pre_hook(lambda m, args: rois.append(args[0].shape[0]))
    model.roi_heads.mask_head.register_forward_pre_hook(lambda m, args: rois.append(args[0].shape[0]))
    images = [torch.rand(3, 128, 160).cuda() for _ in range(2)]
    box = torch.tensor([[10.0, 20.0, 100.0, 120.0]])
    targets = [{"boxes": box.cuda(), "labels": torch.tensor([1]).cuda(),
                "masks": torch.ones(1, 128, 160, dtype=torch.uint8).cuda()}] * 2
    sum(model(images, targets).values()).backward()
    # 1,000 proposals + 1 gt box per image; the sampler keeps 128 positives (box_positive_fraction 0.25 of
    # box_batch_size_per_image 512) + 384 negatives = 512 per image: 1,024 RoIs, not all 2,002 (Note [Nonzero bounds]).
    # The mask head's `where(labels > 0)` reads computed labels: the worst case, all 1,024 sampled RoIs
    assert rois == [1024, 1024]


def test_ctc_loss_forward_and_backward(emu: gt.Emulation) -> None:
    logits = torch.randn(50, 4, 30, device="cuda", requires_grad=True)  # T=50, B=4, C=30 (speech-recognition style)
    targets = torch.randint(1, 30, (4, 12), device="cuda")
    lengths_in = torch.full((4,), 50, dtype=torch.long)
    lengths_tgt = torch.full((4,), 12, dtype=torch.long)
    loss = torch.nn.CTCLoss(blank=0, zero_infinity=True)(logits.log_softmax(2), targets, lengths_in, lengths_tgt)
    loss.backward()
    assert loss.shape == () and logits.grad is not None and logits.grad.shape == (50, 4, 30)
    nll, alpha = torch.ops.aten._ctc_loss(logits.detach().log_softmax(2), targets, [50] * 4, [12] * 4)
    assert nll.shape == (4,) and alpha.shape == (4, 50, 25)  # 2 * 12 + 1 extended-label states
    flat = torch.randint(1, 30, (7,), device="cuda")  # concatenated targets of lengths 3 and 4
    _, alpha = torch.ops.aten._ctc_loss(logits.detach()[:, :2].log_softmax(2), flat, [50, 50], [3, 4])
    assert alpha.shape == (2, 50, 9)  # 2 * max(3, 4) + 1


def test_sparse_embedding_gradients_are_sparse_tensors(emu: gt.Emulation) -> None:
    # they raised an UnsupportedOpError; now emulated (Note [Sparse tensors], test_dlrm_idioms.py)
    emb = torch.nn.Embedding(10, 4, sparse=True).cuda()
    emb(torch.tensor([1, 2], device="cuda")).sum().backward()
    assert emb.weight.grad.is_sparse and emb.weight.grad._nnz() == 2 and emb.weight.grad.device.type == "cuda"
