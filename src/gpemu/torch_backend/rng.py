"""Emulated CUDA random generators: torch.Generator(device="cuda"), torch.cuda.default_generators and the cuda RNG API.

See Note [Emulated CUDA generators]: an emulated generator is a real CPU generator (a subclass of torch._C.Generator,
so every aten op and torch API accepts it) whose `.device` says `cuda:N`. Seeding, `get_state`/`set_state`,
`torch.random.fork_rng(devices=[...])` and checkpointed RNG states all round-trip; the state tensor is 16 bytes
shaped as CUDA's Philox state (seed, offset), naming a snapshot of the CPU generator (Note [Philox states]). Values
drawn on the emulated device are never computed, except where the host reads them back (randperm; see patches.py).
"""

from __future__ import annotations

from typing import Any

import torch

from gpemu.torch_backend import state

_CGenerator = torch._C.Generator
# torch's default CUDA seed (c10/core/GeneratorImpl.h default_rng_seed_val)
DEFAULT_SEED = 67280421310721


# Note [Philox states]: a CUDA generator's state is 16 bytes, its Philox seed and offset (two uint64), and code that
# splits random streams edits the offset: DTensor's OffsetBasedRNGTracker reads `torch.cuda.get_rng_state()`, adds
# each shard's offset and sets it back around every random op on a DTensor. Ours gave the CPU generator's 5056-byte
# state, and the tracker's `state[8:].view(int64)` (631 numbers, not one) raised a bare AssertionError: the first
# `nn.init.trunc_normal_` of an FSDP2-sharded parameter died (pytorch/torchtitan's llama3 init_weights after
# fully_shard and to_empty). An EmuGenerator now answers `get_state()` with a Philox-shaped state: its seed and an
# offset that names a snapshot of the CPU generator underneath (a new offset, 4 past the largest one named, once host
# draws have moved it since). `set_state` of a named (seed, offset) restores that snapshot, so round trips replay
# the same draws as before (fork_rng, checkpointed RNG states, a saved `cuda_rng`); any other 16-byte state (a
# shifted offset, a real GPU's state) seeds the CPU generator from its seed and offset, a distinct stream per offset;
# a 5056-byte CPU state is still accepted. initial_seed() is the Philox seed.
_PHILOX_SNAPSHOTS = 64  # snapshots kept per generator (DTensor's tracker names a new offset per random op)


def _philox_state(seed: int, offset: int) -> torch.Tensor:
    """Return the 16-byte CUDA generator state for `seed` and `offset` (Note [Philox states])."""
    raw = (seed & (2**64 - 1)).to_bytes(8, "little") + (offset & (2**64 - 1)).to_bytes(8, "little")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


class EmuGenerator(_CGenerator):  # type: ignore[misc]
    """A torch.Generator on an emulated `cuda:N`: a CPU generator underneath, `.device` says cuda."""

    _index: int = 0
    _seed: int = DEFAULT_SEED
    _offset: int = 0
    _snapshots: dict[int, torch.Tensor]  # offset -> the CPU generator's state (Note [Philox states])

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        """Return the emulated CUDA device."""
        return torch.device("cuda", self._index)

    def manual_seed(self, seed: Any) -> EmuGenerator:  # type: ignore[override]
        """Seed the generator; its Philox offset restarts at 0."""
        _CGenerator.manual_seed(self, int(seed))
        self._seed, self._offset = _CGenerator.initial_seed(self), 0
        self._snapshots = {0: _CGenerator.get_state(self)}
        return self

    def seed(self) -> int:
        """Seed from a non-deterministic source; return the seed."""
        return int(self.manual_seed(_CGenerator.seed(self)).initial_seed())

    def initial_seed(self) -> int:
        """Return the Philox seed (Note [Philox states])."""
        return self._seed

    def get_state(self) -> torch.Tensor:
        """Return the 16-byte Philox-shaped state, seed and offset (Note [Philox states])."""
        cpu = _CGenerator.get_state(self)
        known = self._snapshots.get(self._offset)
        if known is None or not torch.equal(known, cpu):  # host draws moved the CPU generator: name a new offset
            self._offset = max(self._snapshots, default=-4) + 4
            self._remember(cpu)
        return _philox_state(self._seed, self._offset)

    def set_state(self, new_state: torch.Tensor) -> EmuGenerator:  # type: ignore[override]
        """Restore a state from get_state(), seed from another 16-byte Philox state, or take a CPU state."""
        if new_state.numel() != 16:
            _CGenerator.set_state(self, new_state)
            self._offset = max(self._snapshots, default=-4) + 4
            self._remember(_CGenerator.get_state(self))
            return self
        raw = bytes(new_state.to("cpu", torch.uint8).flatten().tolist())
        seed, offset = int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")
        if seed != self._seed:
            self._snapshots = {}
        known = self._snapshots.get(offset)
        if known is not None:
            _CGenerator.set_state(self, known)
        else:  # an offset not named here: a distinct stream per (seed, offset)
            _CGenerator.manual_seed(self, (seed * 0x9E3779B97F4A7C15 + offset) % 2**64)
            self._remember(_CGenerator.get_state(self), offset)
        self._seed, self._offset = seed, offset
        return self

    def _remember(self, cpu: torch.Tensor, offset: int | None = None) -> None:
        self._snapshots[self._offset if offset is None else offset] = cpu
        while len(self._snapshots) > _PHILOX_SNAPSHOTS:
            del self._snapshots[next(iter(self._snapshots))]

    def __repr__(self) -> str:
        return f"<torch.Generator device=cuda:{self._index} (emulated)>"

    def __reduce__(self) -> Any:
        return _rebuild_generator, (self._index, _CGenerator.get_state(self), self._seed, self._offset)


def _rebuild_generator(index: int, gen_state: torch.Tensor, seed: int | None = None,
                       offset: int = 0) -> EmuGenerator:
    """Return an EmuGenerator on `index` with the CPU state `gen_state` (unpickling; DataLoader workers)."""
    gen = new_generator(index)
    _CGenerator.set_state(gen, gen_state)
    if seed is not None:
        gen._seed, gen._offset, gen._snapshots = seed, offset, {offset: gen_state}
    return gen


def new_generator(index: int, seed: int = DEFAULT_SEED) -> EmuGenerator:
    """Return a fresh emulated generator on device `index`, seeded with `seed`."""
    gen = EmuGenerator()
    gen._index = index
    gen.manual_seed(seed)
    return gen


class _GeneratorMeta(type(_CGenerator)):  # type: ignore[misc]
    """Metaclass of the patched torch.Generator: cuda devices build EmuGenerators; isinstance sees every Generator."""

    def __call__(cls, device: Any = "cpu") -> Any:
        from gpemu.torch_backend.cuda_api import device_index

        if cls is not Generator:  # a script's own subclass of torch.Generator
            return super().__call__(device)
        if _is_cuda(device):
            return new_generator(device_index(device))
        return _CGenerator(device)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _CGenerator)

    def __subclasscheck__(cls, sub: Any) -> bool:
        return isinstance(sub, type) and issubclass(sub, _CGenerator)


class Generator(_CGenerator, metaclass=_GeneratorMeta):  # type: ignore[misc]
    """Stands in for torch.Generator while gpemu is installed (device="cuda" gives an EmuGenerator)."""


RNG_NAMES = ("manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state", "set_rng_state",
             "get_rng_state_all", "set_rng_state_all")
_generators: tuple[EmuGenerator, ...] = ()  # the installed emulation's default generators, one per device


def _is_cuda(device: Any) -> bool:
    if isinstance(device, int):
        return False  # torch.Generator(0) is not a valid spelling; let torch raise
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


def _gen(device: Any = None) -> EmuGenerator:
    from gpemu.torch_backend.cuda_api import device_index

    return _generators[device_index(device)]


def cuda_rng_functions(emu: state.Emulation) -> dict[str, Any]:
    """Return the torch.cuda RNG attributes gpemu replaces (seeding, states, default_generators), by name."""
    global _generators
    gens = _generators = tuple(new_generator(i) for i in range(len(emu.devices)))

    def seed_all() -> None:
        seed = int(gens[0].seed())
        for g in gens[1:]:
            g.manual_seed(seed)

    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        return _gen(device).get_state()

    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        host = new_state.to("cpu") if new_state.is_cuda else new_state
        try:
            _gen(device).set_state(host)  # a 16-byte Philox state: Note [Philox states]
        except RuntimeError:  # a CPU state of another size, or zeros read back: seed from its bytes instead
            _gen(device).manual_seed(int.from_bytes(bytes(host.flatten()[:8].tolist()), "little"))

    def set_rng_state_all(new_states: Any) -> None:
        for i, s in enumerate(new_states):
            set_rng_state(s, i)

    def manual_seed_all(seed: int) -> None:
        for g in gens:
            g.manual_seed(int(seed))

    return {
        "default_generators": gens,
        "manual_seed": lambda seed: _gen().manual_seed(int(seed)) and None,
        "manual_seed_all": manual_seed_all,
        "seed": lambda: _gen().seed() and None,
        "seed_all": seed_all,
        "initial_seed": lambda: _gen().initial_seed(),
        "get_rng_state": get_rng_state,
        "set_rng_state": set_rng_state,
        "get_rng_state_all": lambda: [g.get_state() for g in gens],
        "set_rng_state_all": set_rng_state_all,
    }


# Note [Emulated CUDA generators]: torch.Generator is a C++ class, and `torch.Generator(device="cuda")` needs a CUDA
# driver. While gpemu is installed, `torch.Generator` is a Python subclass with a metaclass: calling it with a cuda
# device returns an EmuGenerator (CPU generator state, `.device` = cuda:N), any other device a plain torch Generator;
# `isinstance(g, torch.Generator)` stays true for every generator. Because an EmuGenerator *is* a C++ generator, it
# can be passed as `generator=` to any torch function: the meta kernels behind emulated tensors ignore it, and CPU
# code (a DataLoader's seed draw, RandomSampler's randperm) draws real numbers from it. torch.cuda.manual_seed* and
# torch.manual_seed (which calls torch.cuda.manual_seed_all) seed the per-device default generators.
