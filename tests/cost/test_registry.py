"""Tests for gpemu.cost.registry: hand-derived FLOPs for conv, linear, matmul and SDPA, and op categories."""

from __future__ import annotations

import torch

from gpemu.cost.registry import conv_flops, op_cost, sdpa_backward_flops, sdpa_flops

aten = torch.ops.aten


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, device="meta", dtype=dtype)


def test_conv_flops_by_hand() -> None:
    x, w = _meta(8, 3, 224, 224), _meta(64, 3, 7, 7)
    out = aten.convolution(x, w, None, [2, 2], [3, 3], [1, 1], False, [0, 0], 1)
    assert tuple(out.shape) == (8, 64, 112, 112)
    # 2 * N * Hout * Wout * Cout * Cin * kh * kw = 2 * 8 * 112 * 112 * 64 * 3 * 7 * 7 = 1888223232
    assert conv_flops(x.shape, w.shape, out.shape) == 1888223232
    cost = op_cost(aten.convolution.default, (x, w, None, [2, 2], [3, 3], [1, 1], False, [0, 0], 1), {}, out)
    assert cost.flops == 1888223232
    assert cost.category == "conv"
    # bytes: x 8*3*224*224*4 = 4816896, w 64*3*7*7*4 = 37632, out 8*64*112*112*4 = 25690112 -> 30544640
    assert cost.bytes == 30544640


def test_depthwise_conv_is_grouped_and_counts_per_group_flops() -> None:
    x, w = _meta(2, 32, 56, 56), _meta(32, 1, 3, 3)
    out = aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 32)
    cost = op_cost(aten.convolution.default, (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 32), {}, out)
    # 2 * 2 * 56 * 56 * 32 * 1 * 3 * 3 = 3612672
    assert cost.flops == 3612672
    assert cost.category == "conv_grouped"


def test_conv_backward_counts_input_and_weight_grads() -> None:
    x, w = _meta(4, 16, 32, 32), _meta(32, 16, 3, 3)
    gy = _meta(4, 32, 32, 32)
    args = (gy, x, w, [32], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
    out = aten.convolution_backward(*args)
    cost = op_cost(aten.convolution_backward.default, args, {}, out)
    # one conv: 2 * 4 * 32 * 32 * 32 * 16 * 3 * 3 = 37748736; grad_input + grad_weight = 2 * 37748736 = 75497472
    assert cost.flops == 75497472
    first_layer = (*args[:-1], [False, True, False])
    assert op_cost(aten.convolution_backward.default, first_layer, {}, out).flops == 37748736


def test_strided_conv_backward_uses_the_output_grid() -> None:
    x, w, gy = _meta(2, 3, 224, 224), _meta(64, 3, 11, 11), _meta(2, 64, 55, 55)
    args = (gy, x, w, [64], [4, 4], [2, 2], [1, 1], False, [0, 0], 1, [False, True, True])
    cost = op_cost(aten.convolution_backward.default, args, {}, aten.convolution_backward(*args))
    # grad_weight only: 2 * 2 * 55 * 55 * 64 * 3 * 11 * 11 = 281107200
    assert (cost.flops, cost.category) == (281107200, "conv")


def test_linear_addmm_flops_by_hand() -> None:
    x, w, b = _meta(32, 1024), _meta(4096, 1024), _meta(4096)
    out = aten.addmm(b, x, w.t())
    cost = op_cost(aten.addmm.default, (b, x, w.t()), {}, out)
    # 2 * m * k * n = 2 * 32 * 1024 * 4096 = 268435456
    assert cost.flops == 268435456
    assert cost.category == "matmul"


def test_mm_and_bmm_flops_by_hand() -> None:
    a, b = _meta(64, 128), _meta(128, 256)
    # 2 * 64 * 128 * 256 = 4194304
    assert op_cost(aten.mm.default, (a, b), {}, aten.mm(a, b)).flops == 4194304
    a3, b3 = _meta(12, 64, 128), _meta(12, 128, 256)
    # 12 * 2 * 64 * 128 * 256 = 50331648
    assert op_cost(aten.bmm.default, (a3, b3), {}, aten.bmm(a3, b3)).flops == 50331648


def test_tensor_core_eligibility_needs_16_bit_and_multiples_of_8() -> None:
    a, b = _meta(64, 128, dtype=torch.float16), _meta(128, 256, dtype=torch.float16)
    assert op_cost(aten.mm.default, (a, b), {}, aten.mm(a, b)).tensor_core
    a2, b2 = _meta(64, 100, dtype=torch.float16), _meta(100, 256, dtype=torch.float16)
    assert not op_cost(aten.mm.default, (a2, b2), {}, aten.mm(a2, b2)).tensor_core
    a32, b32 = _meta(64, 128), _meta(128, 256)
    assert not op_cost(aten.mm.default, (a32, b32), {}, aten.mm(a32, b32)).tensor_core


def test_sdpa_flops_by_hand() -> None:
    # B=2, H=12, S=512, D=64: Q K^T = 2*2*12*512*512*64 = 805306368; P V the same -> 1610612736
    assert sdpa_flops((2, 12, 512, 64), (2, 12, 512, 64), (2, 12, 512, 64)) == 1610612736
    assert sdpa_flops((2, 12, 512, 64), (2, 12, 512, 64), (2, 12, 512, 64), causal=True) == 805306368
    # backward: five matmuls = 2*2*12*512*512*(3*64 + 2*64) = 4026531840 (2.5x forward)
    assert sdpa_backward_flops((2, 12, 512, 64), (2, 12, 512, 64), (2, 12, 512, 64)) == 4026531840


def test_flash_attention_op_cost_uses_fused_formula() -> None:
    q = _meta(2, 12, 512, 64, dtype=torch.float16)
    out = aten._scaled_dot_product_flash_attention(q, q, q, 0.0, True)
    cost = op_cost(aten._scaled_dot_product_flash_attention.default, (q, q, q, 0.0, True), {}, out)
    assert cost.category == "attention"
    assert cost.flops == 805306368  # causal half of 1610612736
    # fused: no S x S matrix; bytes = 3 inputs + output (each 2*12*512*64*2 = 1572864) + logsumexp 2*12*512*4
    assert cost.bytes < 10 * 1572864


def test_views_cost_nothing_and_elementwise_counts_bytes() -> None:
    x = _meta(4, 256)
    v = aten.view(x, [1024])
    assert op_cost(aten.view.default, (x, [1024]), {}, v).category == "view"
    assert op_cost(aten.view.default, (x, [1024]), {}, v).bytes == 0
    y = aten.relu(x)
    cost = op_cost(aten.relu.default, (x,), {}, y)
    # read 4*256*4 = 4096 bytes, write 4096 -> 8192
    assert (cost.category, cost.bytes) == ("elementwise", 8192)


def test_batch_norm_is_one_fused_kernel_with_three_passes() -> None:
    x = _meta(8, 64, 28, 28)
    w = _meta(64)
    args = (x, w, w, w, w, True, 0.1, 1e-5)
    out = aten.native_batch_norm(*args)
    cost = op_cost(aten.native_batch_norm.default, args, {}, out)
    # 3 * |x| = 3 * 8*64*28*28*4 = 4816896
    assert (cost.category, cost.bytes) == ("norm", 4816896)



def test_eval_batch_norm_makes_two_passes() -> None:
    # training: statistics pass + normalise pass = 3 * |x|; eval (running statistics): read x, write y = 2 * |x|
    x = torch.empty(8, 64, 14, 14, device="meta")  # 100352 elements, 401408 bytes in fp32
    w = torch.empty(64, device="meta")
    train = op_cost(torch.ops.aten.native_batch_norm.default, (x, w, w, w, w, True, 0.1, 1e-5), {}, None)
    evald = op_cost(torch.ops.aten.native_batch_norm.default, (x, w, w, w, w, False, 0.1, 1e-5), {}, None)
    legit = op_cost(torch.ops.aten._native_batch_norm_legit_no_training.default, (x, w, w, w, w, 0.1, 1e-5), {},
                    None)
    assert (train.bytes, evald.bytes, legit.bytes) == (3 * 401408, 2 * 401408, 2 * 401408)


def test_nll_loss_reads_only_the_selected_log_probabilities() -> None:
    # a language-model head: 8192 tokens x 50257 classes of fp32 log-probabilities (8192*50257*4 = 1_646_821_376 B)
    x, target = _meta(8192, 50257), torch.empty(8192, dtype=torch.long, device="meta")
    out = aten.nll_loss_forward.default(x, target, None, 1, -100)
    cost = op_cost(aten.nll_loss_forward.default, (x, target, None, 1, -100), {}, out)
    # one fp32 entry per target 8192*4 = 32768, the targets 8192*8 = 65536, loss + total_weight 4 + 4 -> 98312
    assert (cost.flops, cost.bytes, cost.category) == (8192, 98312, "reduction")
    g = torch.empty((), device="meta")
    grad = aten.nll_loss_backward.default(g, x, target, None, 1, -100, out[1])
    cost = op_cost(aten.nll_loss_backward.default, (g, x, target, None, 1, -100, out[1]), {}, grad)
    # writes the whole gradient 8192*50257*4 = 1_646_821_376, scatters 8192*4 = 32768, reads 65536 of targets
    assert cost.bytes == 1_646_821_376 + 32768 + 65536
