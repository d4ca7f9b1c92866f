"""Estimate: a number together with where it came from and how far to trust it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

# measured:     a row measured on the real GPU.
# interpolated: between two measured batch sizes of the same (gpu, workload, phase, dtype).
# extrapolated: outside the measured range (flagged; a warning is issued once per key).
# predicted:    from a cost model (roofline / fitted efficiencies / cross-GPU scaling); `path` says which.
# missing:      nothing could be said; `value` is NaN.
EstimateKind = Literal["measured", "interpolated", "extrapolated", "predicted", "missing"]
ESTIMATE_KINDS: tuple[str, ...] = ("measured", "interpolated", "extrapolated", "predicted", "missing")


@dataclass(frozen=True)
class Estimate:
    """A value with its unit, its kind and a human-readable provenance string."""

    value: float
    unit: str
    kind: EstimateKind
    source: str = ""
    path: str = ""  # for predictions: e.g. "spec-roofline", "scaled-from:Tesla_V100-PCIE-32GB"
    details: dict[str, object] = field(default_factory=dict, compare=False)

    @property
    def ok(self) -> bool:
        """True unless the estimate is missing."""
        return self.kind != "missing"

    def scaled(self, factor: float) -> Estimate:
        """Return the same estimate with its value multiplied by `factor`."""
        return replace(self, value=self.value * factor)

    def to_json(self) -> dict[str, object]:
        """Return a JSON-serialisable dict (the `predict --json` phase object)."""
        out: dict[str, object] = {"seconds" if self.unit == "s" else self.unit: self.value, "source": self.kind}
        if self.source:
            out["provenance"] = self.source
        if self.path:
            out["path"] = self.path
        return out


def missing(unit: str, why: str) -> Estimate:
    """Return a `missing` estimate carrying the reason."""
    return Estimate(float("nan"), unit, "missing", source=why)
