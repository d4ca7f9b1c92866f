"""Pinned host memory: a pool of pre-touched, page-locked (mlock) host buffers, like CUDA's CachingHostAllocator.

See Note [Emulated pinned memory].
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import threading
import warnings
import weakref
from dataclasses import dataclass

import torch

from gpemu.errors import GpemuWarning

PAGE_BYTES = mmap.PAGESIZE
MIN_CLASS_BYTES = 512

# Note [Emulated pinned memory]
# On a GPU server `pin_memory()` copies a batch into page-locked host memory taken from PyTorch's
# CachingHostAllocator (cudaHostAlloc'd blocks, sizes rounded up to a power of two, cached and reused once the
# tensor dies and its copies are done). That copy costs real CPU time and real, unswappable host RAM, which is
# what makes the pin-memory thread matter under host-memory pressure (GPEmu measured a 329 s vs 400 s epoch with
# and without emulating it). We do the same work: buffers are anonymous mmaps rounded to a power of two, every page
# is touched once when the buffer is created, and mlock'd when RLIMIT_MEMLOCK allows; a pinned tensor is a real
# copy into such a buffer, and the buffer returns to the pool when the tensor's storage dies (so a second epoch
# of the same batch shapes allocates nothing new). When mlock fails (limit reached, no permission) we warn once
# and keep plain (pageable but pre-touched) buffers: timing still uses the pinned bandwidth, as the script asked.




def size_class(size_bytes: int) -> int:
    """Return the buffer size a request gets: the next power of two, at least 512 B."""
    if size_bytes <= MIN_CLASS_BYTES:
        return MIN_CLASS_BYTES
    return 1 << (size_bytes - 1).bit_length()


@dataclass(eq=False)
class _Buffer:
    mm: mmap.mmap
    size_bytes: int
    addr: int
    locked: bool


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None


def _mlock(addr: int, size_bytes: int) -> int:
    """Lock pages in RAM; return 0 on success or the errno."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mlock"):
        return -1
    rc = libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(size_bytes))
    return 0 if rc == 0 else ctypes.get_errno()


def _munlock(addr: int, size_bytes: int) -> None:
    libc = _libc()
    if libc is not None and hasattr(libc, "munlock"):
        libc.munlock(ctypes.c_void_p(addr), ctypes.c_size_t(size_bytes))


class PinnedPool:
    """Pool of pooled, pre-touched, page-locked host buffers backing pinned tensors."""

    def __init__(self, lock_pages: bool = True) -> None:
        self.lock_pages = lock_pages
        self._lock = threading.Lock()
        self._free: dict[int, list[_Buffer]] = {}  # size class -> cached buffers
        self._in_use: dict[int, _Buffer] = {}  # data_ptr -> buffer
        self._all: list[_Buffer] = []
        self._warned = False
        self.buffers_created = 0
        self.reuses = 0
        self.copied_bytes = 0

    # ---- buffers ------------------------------------------------------------------------------------------------
    def _new_buffer(self, cls_bytes: int) -> _Buffer:
        mm = mmap.mmap(-1, cls_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        view = torch.frombuffer(mm, dtype=torch.uint8)
        view[::PAGE_BYTES].fill_(0)  # pre-touch: fault every page in now, not during the first copy
        addr = view.data_ptr()
        del view
        locked = False
        if self.lock_pages and not self._warned:
            err = _mlock(addr, cls_bytes)
            if err == 0:
                locked = True
            else:
                self._warn_once(err, cls_bytes)
        buf = _Buffer(mm, cls_bytes, addr, locked)
        self._all.append(buf)
        self.buffers_created += 1
        return buf

    def _warn_once(self, err: int, cls_bytes: int) -> None:
        self._warned = True
        try:
            import resource

            soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
            limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft / 1024**2:.1f} MiB"
        except (ImportError, OSError, ValueError):
            limit = "unknown"
        warnings.warn(
            f"gpemu: could not page-lock a {cls_bytes / 1024**2:.2f} MiB pinned buffer (mlock errno {err}; "
            f"RLIMIT_MEMLOCK {limit}); pinned memory falls back to plain pre-touched buffers. Raise the limit "
            "(ulimit -l) for faithful host-memory pressure.",
            GpemuWarning,
            stacklevel=4,
        )

    def _take(self, size_bytes: int) -> _Buffer:
        cls_bytes = size_class(size_bytes)
        with self._lock:
            free = self._free.get(cls_bytes)
            if free:
                self.reuses += 1
                return free.pop()
            return self._new_buffer(cls_bytes)

    def _give_back(self, buf: _Buffer) -> None:
        with self._lock:
            self._in_use.pop(buf.addr, None)
            self._free.setdefault(buf.size_bytes, []).append(buf)

    # ---- tensors ------------------------------------------------------------------------------------------------
    def empty(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Return an uninitialised contiguous tensor backed by a pooled pinned buffer."""
        numel = 1
        for d in shape:
            numel *= int(d)
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        buf = self._take(max(nbytes, 1))
        out = torch.frombuffer(buf.mm, dtype=dtype, count=numel) if numel else torch.empty(0, dtype=dtype)
        out = out.view(shape)
        if numel:
            with self._lock:
                self._in_use[buf.addr] = buf
            weakref.finalize(out.untyped_storage(), self._give_back, buf)
        else:
            self._give_back(buf)
        return out

    def pin_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """Return a pinned copy of CPU tensor `t` (a real copy into a pooled buffer), as Tensor.pin_memory()."""
        if t.device.type != "cpu":
            raise RuntimeError(f"cannot pin '{t.device.type}' memory: only dense CPU tensors can be pinned")
        if self.is_pinned(t):
            return t
        out = self.empty(t.shape, t.dtype)
        out.copy_(t)
        self.copied_bytes += out.numel() * out.element_size()
        return out

    def is_pinned(self, t: torch.Tensor) -> bool:
        """Return True when `t` (or the tensor it views) lives in one of this pool's buffers."""
        if t.device.type != "cpu" or t.numel() == 0:
            return False
        return t.untyped_storage().data_ptr() in self._in_use

    # ---- accounting ---------------------------------------------------------------------------------------------
    def pinned_bytes(self) -> int:
        """Return host bytes held by the pool (in use + cached), as page-locked memory on a GPU server."""
        return sum(b.size_bytes for b in self._all)

    def in_use_bytes(self) -> int:
        """Return bytes of pool buffers currently backing live tensors."""
        with self._lock:
            return sum(b.size_bytes for b in self._in_use.values())

    def locked_bytes(self) -> int:
        """Return bytes actually page-locked with mlock."""
        return sum(b.size_bytes for b in self._all if b.locked)

    def stats(self) -> dict[str, int]:
        """Return pool counters: buffers created, reuses, pinned/in-use/locked/copied bytes."""
        return {
            "buffers_created": self.buffers_created,
            "reuses": self.reuses,
            "pinned_bytes": self.pinned_bytes(),
            "in_use_bytes": self.in_use_bytes(),
            "locked_bytes": self.locked_bytes(),
            "copied_bytes": self.copied_bytes,
        }

    def empty_cache(self) -> None:
        """Release cached (unused) buffers back to the OS."""
        with self._lock:
            for bufs in self._free.values():
                for buf in bufs:
                    if buf.locked:
                        _munlock(buf.addr, buf.size_bytes)
                    self._all.remove(buf)
                    with contextlib.suppress(BufferError):  # a view may still export it; the GC frees it later
                        buf.mm.close()
            self._free.clear()


_DEFAULT: PinnedPool | None = None
_DEFAULT_LOCK = threading.Lock()


def default_pool() -> PinnedPool:
    """Return the process-wide pinned pool (created on first use)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = PinnedPool()
        return _DEFAULT


def pin_tensor(t: torch.Tensor) -> torch.Tensor:
    """Return a pinned copy of `t` from the process-wide pool."""
    return default_pool().pin_tensor(t)


def is_pinned(t: torch.Tensor) -> bool:
    """Return True when `t` lives in the process-wide pinned pool."""
    return default_pool().is_pinned(t)


def pinned_bytes() -> int:
    """Return host bytes held by the process-wide pinned pool."""
    return default_pool().pinned_bytes()
