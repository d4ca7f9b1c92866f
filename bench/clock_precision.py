"""Clock precision bench: how late RealClock.sleep_until returns, and how much CPU each wait burns.

Usage: .venv/bin/python bench/clock_precision.py [--reps 200] [--margins-us 0,100,200,500] [--json out.json]

For each wait length (100 us, 1 ms, 10 ms) and method (plain time.sleep; RealClock's default margin, the one gpemu
uses; fixed spin margins) it prints the median, p99 and max wait error (return time
minus deadline, in us; never negative) and the CPU time the waiting thread burnt per wait. A plain time.sleep row is
the baseline. The machine's load average is printed too: the error depends on what else is runnable.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from gpemu.device.clock import DEFAULT_SPIN_MARGIN_MAX_S, DEFAULT_SPIN_MARGIN_S, RealClock

WAITS_S = (100e-6, 1e-3, 10e-3)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(wait_s: float, reps: int, clock: RealClock | None) -> dict[str, float]:
    """Return error statistics (us) and CPU us per wait for `reps` waits of `wait_s` (clock None = plain sleep)."""
    errors_us: list[float] = []
    cpu_us: list[float] = []
    for _ in range(reps):
        cpu0 = time.thread_time()
        deadline = time.perf_counter() + wait_s
        if clock is None:
            time.sleep(wait_s)
        else:
            clock.sleep_until(deadline)
        end = time.perf_counter()
        cpu_us.append((time.thread_time() - cpu0) * 1e6)
        errors_us.append((end - deadline) * 1e6)
        time.sleep(200e-6)  # let the scheduler settle between samples
    return {
        "wait_us": wait_s * 1e6,
        "median_err_us": statistics.median(errors_us),
        "p99_err_us": _pct(errors_us, 0.99),
        "max_err_us": max(errors_us),
        "min_err_us": min(errors_us),
        "cpu_us_per_wait": statistics.mean(cpu_us),
        "cpu_frac": statistics.mean(cpu_us) / (wait_s * 1e6),
        "margin_after_us": (clock.margin_s(wait_s) * 1e6) if clock is not None else 0.0,
    }


def main() -> None:
    """Run the sweep and print one table (and optionally write JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--margins-us", default="200", help="fixed margins to compare (us)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args()
    margins = sorted({float(m) * 1e-6 for m in args.margins_us.split(",") if m.strip()})
    methods: list[tuple[str, RealClock | None]] = [("time.sleep", None), ("default", RealClock())]
    methods += [(f"margin {m * 1e6:g}us", RealClock(spin_margin_s=m, max_spin_margin_s=m, spin_fraction=0.0)) for m in margins]

    load1, load5, _ = os.getloadavg()
    print(f"cpus={os.cpu_count()} loadavg(1m,5m)={load1:.2f},{load5:.2f} reps={args.reps} "
          f"default margin={DEFAULT_SPIN_MARGIN_S * 1e6:g} us + 5% of the wait, <= {DEFAULT_SPIN_MARGIN_MAX_S * 1e6:g} us")
    print(f"{'method':>16} {'wait':>8} {'median':>9} {'p99':>9} {'max':>9} {'cpu/wait':>10} {'cpu%':>6} {'margin':>7}")
    rows = []
    for label, clock in methods:
        for wait_s in WAITS_S:
            reps = args.reps if wait_s < 5e-3 else max(50, args.reps // 2)
            row = measure(wait_s, reps, clock)
            row["method"] = label  # type: ignore[assignment]
            rows.append(row)
            print(
                f"{label:>16} {wait_s * 1e6:>6.0f}us {row['median_err_us']:>7.1f}us {row['p99_err_us']:>7.1f}us "
                f"{row['max_err_us']:>7.1f}us {row['cpu_us_per_wait']:>8.1f}us {row['cpu_frac'] * 100:>5.1f} {row['margin_after_us']:>5.0f}us"
            )
    load1, load5, _ = os.getloadavg()
    print(f"loadavg after: {load1:.2f},{load5:.2f}  (errors are return time - deadline; sleep_until never returns early)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"loadavg": os.getloadavg(), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
