"""ProfileDB: layered profile rows (built-in under the user's directory) with measured/interpolated/extrapolated lookup."""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from gpemu.errors import GpemuWarning, UnknownNameError
from gpemu.estimate import Estimate, missing
from gpemu.hardware import GPUSpec, get_gpu
from gpemu.profiles.native import KEY_COLUMNS, empty_rows, read_profile_csv
from gpemu.profiles.schema import DTYPES, PHASES

PROFILE_DIR_ENV = "GPEMU_PROFILE_DIR"
# How many measured points at the edge of the range a linear extrapolation is fitted to (least squares);
# one point's noise must not set the slope (neighbouring GPEmu timings differ by up to ~30%).
EXTRAPOLATION_FIT_POINTS = 8




def user_profile_dir() -> Path:
    """Return the user profile directory: $GPEMU_PROFILE_DIR, else <user data dir>/gpemu/profiles."""
    env = os.environ.get(PROFILE_DIR_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("gpemu")) / "profiles"


def builtin_profile_paths() -> list[Path]:
    """Return the profile CSVs shipped inside the package (src/gpemu/profiles/builtin/*.csv), sorted; none when
    GPEMU_BUILTIN_PROFILES=0 (held-out checks: the cost model alone, as for a GPU nobody measured)."""
    if os.environ.get("GPEMU_BUILTIN_PROFILES", "1").strip().lower() in ("0", "false", "no", "off"):
        return []
    root = resources.files("gpemu.profiles").joinpath("builtin")
    if not root.is_dir():
        return []
    return sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith(".csv"))


def _csvs_in(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.csv") if not p.name.startswith("."))


@dataclass
class _Series:
    """The usable points of one (gpu, workload, phase, dtype), sorted by batch size.

    Measured rows only; when a key has no measured row at all, its filled rows (`only_filled`), which can then
    only ever be answered as extrapolated.
    """

    batch: np.ndarray  # int64
    value: np.ndarray  # float64
    source: tuple[str, ...]
    unit: str
    all_batch: np.ndarray  # every row's batch size, measured or not (for batch_sizes(measured_only=False))
    only_filled: bool
    fits: dict[bool, tuple[float, float, str]] = field(default_factory=dict)  # above-range? -> slope, intercept, how


class ProfileDB:
    """Profile rows with lookup; build with default(), from_paths() or from_rows()."""

    _default_cache: dict[tuple[str, ...], ProfileDB] = {}
    _cache_lock = threading.Lock()

    def __init__(self, rows: pd.DataFrame | None = None, origins: Iterable[str] = ()) -> None:
        table = empty_rows() if rows is None else _canonical_gpus(rows)
        self._rows = table.drop_duplicates(list(KEY_COLUMNS), keep="last").reset_index(drop=True)
        self.origins: tuple[str, ...] = tuple(origins)
        self._series: dict[tuple[str, str, str, str], _Series | None] = {}
        self._warned: set[tuple[str, str, str, str]] = set()
        self._index_lock = threading.Lock()

    # ---- construction -------------------------------------------------------------------------------------
    @classmethod
    def from_rows(cls, rows: pd.DataFrame) -> ProfileDB:
        """Return a database over an in-memory table with the native columns (later rows win on a key)."""
        return cls(rows, origins=("<rows>",))

    @classmethod
    def from_paths(cls, paths: Iterable[str | os.PathLike[str]]) -> ProfileDB:
        """Return a database of the given CSV files and directories (their *.csv); later paths win on a key."""
        files: list[Path] = []
        for p in map(Path, paths):
            files += _csvs_in(p) if p.is_dir() else [p]
        tables = [read_profile_csv(f) for f in files]
        rows = pd.concat(tables, ignore_index=True) if tables else empty_rows()
        return cls(rows, origins=[str(f) for f in files])

    @classmethod
    def default(cls) -> ProfileDB:
        """Return the cached default database: built-in profiles layered under the user profile directory."""
        # Cheap staleness check (one stat): writing a profile with os.replace updates the directory's mtime.
        user_dir = user_profile_dir()
        try:
            stamp = user_dir.stat().st_mtime_ns
        except OSError:
            stamp = -1
        key = (str(user_dir), str(stamp))
        db = cls._default_cache.get(key)
        if db is not None:
            return db
        with cls._cache_lock:
            db = cls._default_cache.get(key)
            if db is None:
                db = cls.from_paths([*builtin_profile_paths(), *_csvs_in(user_dir)])
                cls._default_cache.clear()
                cls._default_cache[key] = db
            return db

    @classmethod
    def reload(cls) -> ProfileDB:
        """Clear the default-database cache and return a freshly loaded default()."""
        cls.clear_cache()
        return cls.default()

    @classmethod
    def clear_cache(cls) -> None:
        """Forget the cached default database (the next default() reads the files again)."""
        with cls._cache_lock:
            cls._default_cache.clear()

    # ---- queries ------------------------------------------------------------------------------------------
    @property
    def rows(self) -> pd.DataFrame:
        """Return all rows (a copy) as a DataFrame with the native columns."""
        return self._rows.copy()

    def __len__(self) -> int:
        return len(self._rows)

    def gpus(self) -> list[str]:
        """Return the GPU keys that have at least one row, sorted."""
        return sorted(set(self._rows["gpu"]))

    def workloads(self, gpu: str | GPUSpec | None = None) -> list[str]:
        """Return the workloads with rows (on `gpu` when given), sorted."""
        rows = self._rows if gpu is None else self._rows[self._rows["gpu"] == _gpu_key(gpu)]
        return sorted(set(rows["workload"]))

    def has(self, gpu: str | GPUSpec, workload: str) -> bool:
        """Return True when any row exists for (gpu, workload)."""
        rows = self._rows
        return bool(((rows["gpu"] == _gpu_key(gpu)) & (rows["workload"] == workload)).any())

    def batch_sizes(
        self, gpu: str | GPUSpec, workload: str, phase: str, dtype: str = "fp32", measured_only: bool = True
    ) -> list[int]:
        """Return the sorted batch sizes with rows for the key (only measured ones unless measured_only=False)."""
        series = self._get_series(_gpu_key(gpu), workload, _check_phase(phase), _check_dtype(dtype))
        if series is None:
            return []
        if not measured_only:
            return [int(b) for b in series.all_batch]
        return [] if series.only_filled else [int(b) for b in series.batch]

    def lookup(
        self,
        gpu: str | GPUSpec,
        workload: str,
        phase: str,
        batch_size: int,
        dtype: str = "fp32",
        warn: bool = True,
    ) -> Estimate:
        """Return the figure for the key at batch_size: measured, interpolated, extrapolated (warned once) or missing.

        warn=False: a caller that may discard an extrapolation (e.g. to prefer a cost model) gets no GpemuWarning.
        """
        key = (_gpu_key(gpu), workload, _check_phase(phase), _check_dtype(dtype))
        series = self._get_series(*key)
        if series is None:
            return missing(phase_unit(key[2]), f"no profile rows for {'/'.join(key)}")
        b = int(batch_size)
        mb, mv = series.batch, series.value
        if series.only_filled:  # whatever we return is someone's extrapolation
            return self._extrapolate(key, series, b, warn, note="only unmeasured (filled) rows")
        if len(mb) == 1 and mb[0] == 0:  # a batch-independent row (e.g. model_h2d) holds for every batch size
            b = 0
        i = int(np.searchsorted(mb, b))
        if i < len(mb) and mb[i] == b:
            return Estimate(float(mv[i]), series.unit, "measured", source=series.source[i], details={"batch_size": b})
        if 0 < i < len(mb):
            b0, b1, v0, v1 = int(mb[i - 1]), int(mb[i]), float(mv[i - 1]), float(mv[i])
            value = v0 + (v1 - v0) * (b - b0) / (b1 - b0)
            return Estimate(
                value,
                series.unit,
                "interpolated",
                source=f"linear between batch {b0} and {b1} of {series.source[i]}",
                path="profile-interpolation",
                details={"neighbours": [(b0, v0), (b1, v1)]},
            )
        return self._extrapolate(key, series, b, warn)

    # ---- internals ----------------------------------------------------------------------------------------
    def _extrapolate(
        self, key: tuple[str, str, str, str], series: _Series, b: int, warn: bool, note: str = ""
    ) -> Estimate:
        mb, mv = series.batch, series.value
        above = b > mb[-1]
        n = min(EXTRAPOLATION_FIT_POINTS, len(mb))
        xb, xv = (mb[-n:], mv[-n:]) if above else (mb[:n], mv[:n])
        fit = series.fits.get(above)
        if fit is None:
            if n >= 2 and xb[-1] != xb[0]:
                slope, intercept = np.polyfit(xb.astype(float), xv, 1)
                how = f"least-squares line through the {n} {'largest' if above else 'smallest'} batch sizes"
            else:  # one point: proportional to batch size
                slope, intercept = (xv[0] / xb[0], 0.0) if xb[0] > 0 else (0.0, xv[0])
                how = "proportional to batch size from the only row"
            fit = series.fits[above] = (float(slope), float(intercept), how)
        slope, intercept, how = fit
        value = max(slope * b + intercept, 0.0)
        if warn and key not in self._warned:
            self._warned.add(key)
            warnings.warn(
                f"{'/'.join(key)}: batch size {b} is outside the measured range "
                f"{int(mb[0])}..{int(mb[-1])}; extrapolating linearly ({note or how})",
                GpemuWarning,
                stacklevel=3,
            )
        return Estimate(
            value,
            series.unit,
            "extrapolated",
            source=f"{how} of {series.source[-1 if above else 0]}" + (f" ({note})" if note else ""),
            path="profile-extrapolation",
            details={"neighbours": [(int(x), float(y)) for x, y in zip(xb, xv, strict=True)]},
        )

    def _get_series(self, gpu: str, workload: str, phase: str, dtype: str) -> _Series | None:
        if not self._series:
            with self._index_lock:
                if not self._series:
                    self._build_index()
        return self._series.get((gpu, workload, phase, dtype))

    def _build_index(self) -> None:
        index: dict[tuple[str, str, str, str], _Series | None] = {("", "", "", ""): None}  # non-empty once built
        rows = self._rows.sort_values("batch_size", kind="stable")
        for (gpu, workload, phase, dtype), grp in rows.groupby(["gpu", "workload", "phase", "dtype"], sort=False):
            measured = grp["measured"].to_numpy() == 1
            use = measured if measured.any() else np.ones(len(grp), dtype=bool)
            index[(str(gpu), str(workload), str(phase), str(dtype))] = _Series(
                batch=grp["batch_size"].to_numpy(dtype=np.int64)[use],
                value=grp["value"].to_numpy(dtype=float)[use],
                source=tuple(src for src, keep in zip(grp["source"].astype(str), use, strict=True) if keep),
                unit=str(grp["unit"].iloc[0]),
                all_batch=grp["batch_size"].to_numpy(dtype=np.int64),
                only_filled=not measured.any(),
            )
        self._series = index


def phase_unit(phase: str) -> str:
    """Return the unit of a phase's values: "MiB" for mem_* phases, else "s"."""
    return "MiB" if phase.startswith("mem_") else "s"


def _canonical_gpus(rows: pd.DataFrame) -> pd.DataFrame:
    """Return rows with every GPU name the catalog knows replaced by its key (unknown names kept)."""
    mapping: dict[str, str] = {}
    for name in set(rows["gpu"]):
        try:
            mapping[name] = get_gpu(name).key
        except UnknownNameError:
            mapping[name] = name
    if all(k == v for k, v in mapping.items()):
        return rows
    out = rows.copy()
    out["gpu"] = out["gpu"].map(mapping)
    return out


def _gpu_key(gpu: str | GPUSpec) -> str:
    if isinstance(gpu, GPUSpec):
        return gpu.key
    key = _GPU_KEYS.get(gpu)
    if key is None:
        key = _GPU_KEYS[gpu] = get_gpu(gpu).key
    return key


_GPU_KEYS: dict[str, str] = {}  # name as given -> catalog key (lookups sit on the emulator's hot path)


def _check_phase(phase: str) -> str:
    if phase not in PHASES:
        raise UnknownNameError("phase", phase, PHASES)
    return phase


def _check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise UnknownNameError("dtype", dtype, DTYPES)
    return dtype
