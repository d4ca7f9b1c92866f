"""Emulated CUDA random generators: torch.Generator(device="cuda"), torch.cuda.default_generators and the cuda RNG API.

See Note [Emulated CUDA generators]: an emulated generator is a real CPU generator (a subclass of torch._C.Generator,
so every aten op and torch API accepts it) whose `.device` says `cuda:N`. Seeding, `get_state`/`set_state`,
`torch.random.fork_rng(devices=[...])` and checkpointed RNG states all round-trip; the state tensor is the CPU
generator's (5056 bytes), not CUDA's Philox state (16 bytes). Values drawn on the emulated device are never computed,
except where the host reads them back (randperm; see patches.py).
"""

from __future__ import annotations

from typing import Any

import torch

from gpemu.torch_backend import state

_CGenerator = torch._C.Generator
# torch's default CUDA seed (c10/core/GeneratorImpl.h default_rng_seed_val)
DEFAULT_SEED = 67280421310721


class EmuGenerator(_CGenerator):  # type: ignore[misc]
    """A torch.Generator on an emulated `cuda:N`: a CPU generator underneath, `.device` says cuda."""

    _index: int = 0

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        """Return the emulated CUDA device."""
        return torch.device("cuda", self._index)

    def __repr__(self) -> str:
        return f"<torch.Generator device=cuda:{self._index} (emulated)>"

    def __reduce__(self) -> Any:
        return _rebuild_generator, (self._index, self.get_state())


def _rebuild_generator(index: int, gen_state: torch.Tensor) -> EmuGenerator:
    """Return an EmuGenerator on `index` with `gen_state` (unpickling; DataLoader workers)."""
    gen = new_generator(index)
    gen.set_state(gen_state)
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
            _gen(device).set_state(host)
        except RuntimeError:  # a real CUDA (Philox, 16 B) state, or zeros read back: seed from its bytes instead
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
