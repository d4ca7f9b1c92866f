"""Micro-benchmarks of a real CUDA GPU: matmul, SDPA, convolution (NCHW and NHWC), batch norm, copies, launches.

Run on a machine with a GPU (bench/gpu_session.sh does): `python bench/gpu_micro.py --out micro.csv [--budget-s 60]`.
Each row is the median over 5 timed batches of back-to-back calls between CUDA events (after 3 warm-up calls),
with the work counted by hand (FLOPs, bytes) so a row carries its achieved TFLOP/s or GB/s. The rows are the
ceilings and efficiency points gpemu's cost model is checked against (bench/gpu_micro_check.py, on any machine).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional as F

FIELDS = ("kind", "name", "dtype", "layout", "shape", "pass", "time_s", "flops", "bytes_", "tflops", "gbps", "note")


def time_s(fn: Callable[[], object], min_batch_s: float = 0.004) -> float:
    """Return the median seconds per call of `fn` (3 warm-ups, then 5 batches sized to >= min_batch_s each)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-6)
    n = max(1, min(200, int(min_batch_s / one)))
    per_call = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize()
        per_call.append(start.elapsed_time(end) / 1e3 / n)
    return statistics.median(per_call)


class Rows:
    """Collects result rows and rewrites the CSV after each one (a killed run keeps what it measured)."""

    def __init__(self, path: Path, deadline: float) -> None:
        self.path, self.deadline, self.rows = path, deadline, []

    def add(self, **row: object) -> None:
        t, flops, bytes_ = float(row["time_s"]), float(row.get("flops", 0)), float(row.get("bytes_", 0))  # type: ignore[arg-type]
        row["tflops"] = f"{flops / t / 1e12:.2f}" if flops else ""
        row["gbps"] = f"{bytes_ / t / 1e9:.1f}" if bytes_ else ""
        row["time_s"] = f"{t:.4e}"
        self.rows.append({k: row.get(k, "") for k in FIELDS})
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w", newline="") as fh:
            w = csv.DictWriter(fh, FIELDS)
            w.writeheader()
            w.writerows(self.rows)
        tmp.replace(self.path)
        print(",".join(str(self.rows[-1][k]) for k in FIELDS), flush=True)

    def late(self) -> bool:
        return time.monotonic() > self.deadline


DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def bench_matmul(rows: Rows) -> None:
    shapes = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
              (8192, 768, 768), (8192, 3072, 768), (8192, 768, 3072), (16384, 4096, 4096), (512, 768, 768),
              (32768, 50304, 768)]  # fmt: skip
    for label in ("bf16", "fp16", "tf32", "fp32"):
        torch.backends.cuda.matmul.allow_tf32 = label == "tf32"
        for m, n, k in shapes:
            if rows.late():
                return
            if label == "fp32" and m * n * k > 8192**3:
                continue
            a = torch.randn(m, k, device="cuda", dtype=DTYPES[label])
            b = torch.randn(k, n, device="cuda", dtype=DTYPES[label])
            t = time_s(lambda a=a, b=b: a @ b)
            size = a.element_size()
            rows.add(kind="matmul", name="mm", dtype=label, shape=f"{m}x{n}x{k}", time_s=t, flops=2 * m * n * k,
                     bytes_=size * (m * k + k * n + m * n))  # fmt: skip
    torch.backends.cuda.matmul.allow_tf32 = False


def bench_sdpa(rows: Rows) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    shapes = [(8, 12, 512, 64), (4, 12, 1024, 64), (2, 12, 2048, 64), (1, 12, 4096, 64), (8, 16, 1024, 128),
              (2, 16, 4096, 128), (32, 12, 128, 64)]  # fmt: skip
    for label in ("bf16", "fp16"):
        for b, h, s, d in shapes:
            for causal in (False, True):
                for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
                    if rows.late():
                        return
                    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=DTYPES[label], requires_grad=True)
                               for _ in range(3))  # fmt: skip
                    flops_fwd = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
                    try:
                        with sdpa_kernel(backend):
                            fwd = time_s(lambda q=q, k=k, v=v, c=causal: F.scaled_dot_product_attention(q, k, v, is_causal=c))
                            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            grad = torch.randn_like(out)

                            def fwd_bwd(q=q, k=k, v=v, c=causal, g=grad) -> None:
                                F.scaled_dot_product_attention(q, k, v, is_causal=c).backward(g)

                            both = time_s(fwd_bwd)
                    except RuntimeError as exc:
                        print(f"sdpa {backend.name} {b}x{h}x{s}x{d}: {exc}"[:200], file=sys.stderr)
                        continue
                    shape = f"{b}x{h}x{s}x{d}" + ("-causal" if causal else "")
                    io = 4 * b * h * s * d * q.element_size()
                    rows.add(kind="sdpa", name=backend.name.lower(), dtype=label, shape=shape, **{"pass": "fwd"},
                             time_s=fwd, flops=flops_fwd, bytes_=io)  # fmt: skip
                    # backward does 2.5x the forward's matmul FLOPs (dQ, dK, dV, and the recomputed scores)
                    rows.add(kind="sdpa", name=backend.name.lower(), dtype=label, shape=shape, **{"pass": "fwd+bwd"},
                             time_s=both, flops=3.5 * flops_fwd, bytes_=3 * io)  # fmt: skip


RESNET50_CONVS = [  # (c_in, c_out, kernel, stride, spatial_in): ResNet-50's distinct convolutions at 224x224
    (3, 64, 7, 2, 224), (64, 64, 1, 1, 56), (64, 64, 3, 1, 56), (64, 256, 1, 1, 56), (256, 128, 1, 1, 56),
    (128, 128, 3, 2, 56), (128, 128, 3, 1, 28), (512, 256, 1, 1, 28), (256, 256, 3, 1, 14), (1024, 512, 1, 1, 14),
    (512, 512, 3, 1, 7), (512, 2048, 1, 1, 7), (32 * 4, 32 * 4, 3, 1, 56),
]  # fmt: skip


def bench_conv(rows: Rows, batch: int = 128) -> None:
    for label in ("fp16", "tf32", "fp32"):
        torch.backends.cudnn.allow_tf32 = label != "fp32"
        for layout in ("nchw", "nhwc"):
            fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
            for cin, cout, k, stride, hw in RESNET50_CONVS:
                if rows.late():
                    torch.backends.cudnn.allow_tf32 = True
                    return
                x = torch.randn(batch, cin, hw, hw, device="cuda", dtype=DTYPES[label]).to(memory_format=fmt)
                w = torch.randn(cout, cin, k, k, device="cuda", dtype=DTYPES[label]).to(memory_format=fmt)
                x.requires_grad_(cin > 3)
                w.requires_grad_(True)
                out = F.conv2d(x, w, stride=stride, padding=k // 2)
                ho = out.shape[-1]
                flops = 2 * batch * cout * ho * ho * cin * k * k
                fwd = time_s(lambda x=x, w=w, s=stride, p=k // 2: F.conv2d(x, w, stride=s, padding=p))
                g = torch.randn_like(out)

                def fwd_bwd(x=x, w=w, s=stride, p=k // 2, g=g) -> None:
                    F.conv2d(x, w, stride=s, padding=p).backward(g)

                both = time_s(fwd_bwd)
                shape = f"b{batch}-{cin}x{hw}x{hw}-k{k}s{stride}-{cout}"
                bytes_ = x.element_size() * (x.numel() + w.numel() + out.numel())
                rows.add(kind="conv", name="conv2d", dtype=label, layout=layout, shape=shape, **{"pass": "fwd"},
                         time_s=fwd, flops=flops, bytes_=bytes_)  # fmt: skip
                rows.add(kind="conv", name="conv2d", dtype=label, layout=layout, shape=shape, **{"pass": "fwd+bwd"},
                         time_s=both, flops=(3 if cin > 3 else 2) * flops, bytes_=3 * bytes_)  # fmt: skip
    torch.backends.cudnn.allow_tf32 = True


def bench_memory_bound(rows: Rows) -> None:
    n = 256 * 1024**2  # 1 GiB of fp32
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    rows.add(kind="copy", name="d2d", dtype="fp32", shape=str(n), time_s=time_s(lambda: y.copy_(x)), bytes_=8 * n)
    rows.add(kind="elementwise", name="add", dtype="fp32", shape=str(n), time_s=time_s(lambda: torch.add(x, y, out=y)),
             bytes_=12 * n)  # fmt: skip
    rows.add(kind="elementwise", name="relu", dtype="fp32", shape=str(n), time_s=time_s(lambda: torch.relu(x)),
             bytes_=8 * n)  # fmt: skip
    for label in ("fp16", "fp32"):
        for layout in ("nchw", "nhwc"):
            fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
            x = torch.randn(128, 256, 56, 56, device="cuda", dtype=DTYPES[label]).to(memory_format=fmt)
            x.requires_grad_(True)
            bn = torch.nn.BatchNorm2d(256).cuda().to(memory_format=fmt)
            if label == "fp16":
                bn = bn.half()
            out = bn(x)
            g = torch.randn_like(out)
            fwd = time_s(lambda bn=bn, x=x: bn(x))

            def fwd_bwd(bn=bn, x=x, g=g) -> None:
                bn(x).backward(g)

            both = time_s(fwd_bwd)
            shape = "128x256x56x56"
            rows.add(kind="bn", name="batch_norm", dtype=label, layout=layout, shape=shape, **{"pass": "fwd"},
                     time_s=fwd, bytes_=2 * x.numel() * x.element_size())  # fmt: skip
            rows.add(kind="bn", name="batch_norm", dtype=label, layout=layout, shape=shape, **{"pass": "fwd+bwd"},
                     time_s=both, bytes_=5 * x.numel() * x.element_size())  # fmt: skip
    host = torch.empty(256 * 1024**2, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty_like(host, device="cuda")
    rows.add(kind="copy", name="h2d_pinned", dtype="u8", shape=str(host.numel()),
             time_s=time_s(lambda: dev.copy_(host, non_blocking=True)), bytes_=host.numel())  # fmt: skip
    rows.add(kind="copy", name="d2h_pinned", dtype="u8", shape=str(host.numel()),
             time_s=time_s(lambda: host.copy_(dev, non_blocking=True)), bytes_=host.numel())  # fmt: skip


def bench_launch(rows: Rows) -> None:
    x = torch.zeros(1, device="cuda")
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize()
    n = 5000
    t0 = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    host_s = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    device_s = (time.perf_counter() - t0) / n
    rows.add(kind="launch", name="add_1elem_host", dtype="fp32", shape="1", time_s=host_s, note="host issue time/op")
    rows.add(kind="launch", name="add_1elem_device", dtype="fp32", shape="1", time_s=device_s,
             note="issue + drain, per op")  # fmt: skip


def bench_graph(rows: Rows) -> None:
    """Per-kernel time of in-place adds replayed from a CUDA graph, tiny (1 element) and 4 MiB: what a graph-replayed
    small kernel costs without host dispatch (Note [CUDA graphs]: captured ops keep their eager per-op prices)."""
    n = 200
    for numel in (1, 1 << 20):
        x = torch.zeros(numel, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.add_(1)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(n):
                x.add_(1)
        for _ in range(3):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        end.synchronize()
        rows.add(kind="graph", name="add_", dtype="fp32", shape=str(numel),
                 time_s=start.elapsed_time(end) / 1e3 / (20 * n), bytes_=2 * x.numel() * x.element_size(),
                 note=f"per kernel, {n} adds replayed from one CUDA graph")  # fmt: skip


def bench_decode(rows: Rows) -> None:
    """nvJPEG through torchvision: per-image decode time of ImageNet-sized JPEGs (500 x 375, quality 90) on the GPU,
    batched (64) and one by one, and libjpeg-turbo on one host core: what a GPU-decode price needs (Note [nvJPEG])."""
    import io

    import numpy as np
    import torchvision
    from PIL import Image

    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (375 // 8 + 1, 500 // 8 + 1, 3), dtype=np.uint8)  # smooth-ish content, not noise
    datas = []
    for i in range(64):
        img = Image.fromarray(np.roll(base, i, axis=1)).resize((500, 375), Image.BILINEAR)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        datas.append(torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8))
    pixels = 500 * 375
    mean_bytes = sum(d.numel() for d in datas) / len(datas)
    torchvision.io.decode_jpeg(datas, device="cuda")  # warm-up: nvJPEG handles, buffers
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        torchvision.io.decode_jpeg(datas, device="cuda")
    torch.cuda.synchronize()
    batched_s = (time.perf_counter() - t0) / (5 * len(datas))
    t0 = time.perf_counter()
    for d in datas:
        torchvision.io.decode_jpeg(d, device="cuda")
    torch.cuda.synchronize()
    single_s = (time.perf_counter() - t0) / len(datas)
    t0 = time.perf_counter()
    for d in datas:
        torchvision.io.decode_jpeg(d)
    cpu_s = (time.perf_counter() - t0) / len(datas)
    for name, seconds in (("nvjpeg_batched64", batched_s), ("nvjpeg_single", single_s), ("cpu_one_core", cpu_s)):
        rows.add(kind="decode", name=name, dtype="u8", shape="375x500x3", time_s=seconds, bytes_=int(mean_bytes),
                 note=f"per image (wall, host included); {pixels} pixels, mean {mean_bytes:.0f} B compressed")


def main(argv: list[str] | None = None) -> int:
    """Run every micro-benchmark group until `--budget-s` is spent; write the CSV after each row."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=90.0)
    args = parser.parse_args(argv)
    rows = Rows(args.out, time.monotonic() + args.budget_s)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} cuda {torch.version.cuda} "
          f"cudnn {torch.backends.cudnn.version()}", flush=True)  # fmt: skip
    for group in (bench_launch, bench_graph, bench_decode, bench_memory_bound, bench_matmul, bench_sdpa, bench_conv):
        if rows.late():
            print(f"budget spent before {group.__name__}", flush=True)
            break
        try:
            group(rows)
        except Exception as exc:  # keep the other groups' rows
            print(f"{group.__name__} failed: {type(exc).__name__}: {exc}"[:300], file=sys.stderr, flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
