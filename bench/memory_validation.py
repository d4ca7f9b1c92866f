"""Compare gpemu's simulated peak/persistent training memory with GPEmu's measured rows (ROWS.csv, measured=1).

Usage: .venv/bin/python bench/memory_validation.py [--batches 1,8,32,64,128] [--models resnet50,...] [--no-max-batch]
Simulations are cached in <gpemu cache dir>/memory_validation.json (per model, batch size; memory does not depend on the GPU
in this model, see docs/memory.md). Prints errors, not verdicts.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from gpemu.memory.predict import GPEMU_DATA_SEMANTICS, max_batch_size, predict_memory
from gpemu.paths import cache_dir

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("GPEMU_SHARED_DATA", REPO.parent / "shared" / "data")) / "gpemu-profiles"
CACHE = cache_dir() / "memory_validation.json"
GPU_KEYS = {  # GPEmu folder name -> gpemu catalog key
    "Tesla_K80": "k80",
    "Tesla_M40": "m40",
    "Tesla_P100-PCIE-16GB": "p100-pcie-16gb",
    "Tesla_V100-PCIE-32GB": "v100-pcie-32gb",
    "Quadro_RTX_6000": "quadro-rtx-6000",
}


def load_rows() -> dict[tuple[str, str, int], dict[str, float]]:
    """Return measured rows: (gpu, model, batch) -> {"mem_peak": MiB, "mem_persistent": MiB}."""
    out: dict[tuple[str, str, int], dict[str, float]] = defaultdict(dict)
    with (DATA / "ROWS.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            if row["kind"] in ("mem_peak", "mem_persistent") and row["measured"].strip() == "1":
                out[(row["gpu"], row["model"], int(float(row["batch_size"])))][row["kind"]] = float(row["value"])
    return out


def pct(values: list[float], q: float) -> float:
    """Return the q-quantile (0..1) of values (nearest rank)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,2,8,32,64,128,256")
    parser.add_argument("--models", default="")
    parser.add_argument("--no-max-batch", action="store_true")
    args = parser.parse_args()
    console = Console()
    if not (DATA / "ROWS.csv").exists():
        console.print(f"[red]reference data not found at {DATA}[/red]")
        return 2
    rows = load_rows()
    batches = {int(b) for b in args.batches.split(",")}
    wanted = set(args.models.split(",")) if args.models else None
    todo = sorted({(m, b) for (_, m, b) in rows if b in batches and (wanted is None or m in wanted)})
    cache: dict[str, dict[str, float]] = json.loads(CACHE.read_text()) if CACHE.exists() else {}
    failed: dict[str, str] = {}
    start = time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("simulating training steps on meta", total=len(todo))
        for model, b in todo:
            key = f"{model}@{b}"
            if key not in cache and model not in failed:
                try:
                    # GPEmu built torchvision models with their defaults (googlenet keeps aux classifiers)
                    got = predict_memory("v100", model, b, source="torchvision", iterations=3, **GPEMU_DATA_SEMANTICS)
                    cache[key] = {"peak_mib": float(got["peak_mib"]), "persistent_mib": float(got["persistent_mib"])}  # type: ignore[arg-type]
                except Exception as exc:  # a model we cannot build: report it, go on
                    failed[model] = f"{type(exc).__name__}: {exc}"
            progress.advance(task)
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    CACHE.write_text(json.dumps(cache, indent=0, sort_keys=True))
    errors: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (gpu, model, b), meas in rows.items():
        sim = cache.get(f"{model}@{b}")
        if sim is None or b not in batches:
            continue
        for kind, sim_key in (("mem_peak", "peak_mib"), ("mem_persistent", "persistent_mib")):
            if kind in meas:
                err = abs(sim[sim_key] / meas[kind] - 1) * 100
                errors[gpu][kind].append(err)
                errors["ALL"][kind].append(err)
    table = Table(title=f"Memory: simulated vs measured (batches {sorted(batches)})")
    for col in ("GPU", "kind", "rows", "median |err| %", "p90 |err| %", "max |err| %"):
        table.add_column(col)
    for gpu in [*sorted(g for g in errors if g != "ALL"), "ALL"]:
        for kind, errs in sorted(errors[gpu].items()):
            table.add_row(gpu, kind, str(len(errs)), f"{statistics.median(errs):.2f}", f"{pct(errs, 0.9):.2f}",
                          f"{max(errs):.2f}")
    console.print(table)
    both = errors["ALL"]["mem_peak"] + errors["ALL"]["mem_persistent"]
    if both:
        console.print(f"overall: {len(both)} comparisons, median {statistics.median(both):.2f} %, "
                      f"p90 {pct(both, 0.9):.2f} % (targets 3 % / 8 %)")
    worst = sorted(((abs(cache[f'{m}@{b}']['peak_mib'] / v['mem_peak'] - 1) * 100, g, m, b)
                    for (g, m, b), v in rows.items() if f"{m}@{b}" in cache and b in batches and "mem_peak" in v),
                   reverse=True)[:8]
    console.print("largest peak errors: " + ", ".join(f"{m}@{b} on {g} {e:.1f}%" for e, g, m, b in worst))
    for model, why in failed.items():
        console.print(f"[yellow]could not simulate {model}: {why}[/yellow]")
    if not args.no_max_batch:
        _max_batch_table(console, rows, wanted, failed)
    console.print(f"done in {time.perf_counter() - start:.0f} s")
    return 0


def _max_batch_table(console: Console, rows: dict[tuple[str, str, int], dict[str, float]],
                     wanted: set[str] | None, failed: dict[str, str]) -> None:
    # The largest batch GPEmu could run = the largest batch with a MEASURED forward time: beyond the first OOM it filled
    # the times with a straight line (measured=0). The memory rows' flags are not reliable for this (some rows flagged
    # measured exceed the card's capacity), so they are not used here.
    largest: dict[tuple[str, str], int] = {}
    with (DATA / "ROWS.csv").open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            if row["kind"] == "forward" and row["measured"].strip() == "1":
                gpu, model = row["gpu"], row["model"]
                if (wanted is None or model in wanted) and any(k[0] == gpu and k[1] == model for k in rows):
                    largest[(gpu, model)] = max(largest.get((gpu, model), 0), int(float(row["batch_size"])))
    table = Table(title="Largest batch that fits (predicted, capped at 256) vs largest batch with a measured time")
    for col in ("GPU", "model", "predicted max", "largest run", "agrees"):
        table.add_column(col)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("bisecting max batch size", total=len(largest))
        for (gpu, model), measured in sorted(largest.items()):
            progress.advance(task)
            if model in failed:
                continue
            pred = max_batch_size(GPU_KEYS[gpu], model, upper=256, source="torchvision", **GPEMU_DATA_SEMANTICS)
            # GPEmu measured up to 256 and stopped at the first batch that did not fit
            agrees = "yes" if pred == measured else f"{pred - measured:+d}"
            table.add_row(gpu, model, str(pred), str(measured), agrees)
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())
