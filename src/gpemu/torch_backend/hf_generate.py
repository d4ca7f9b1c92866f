"""transformers' beam search under emulation: it runs to its max length, as greedy search does (Note [Beam search
under emulation])."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from gpemu.torch_backend.import_hooks import patch_when_imported
from gpemu.torch_backend.ops import read_answers
from gpemu.torch_backend.tensor import EmuTensor

if TYPE_CHECKING:
    from gpemu.torch_backend.patches import Patcher

_MODULE = "transformers.generation.utils"

# Note [Beam search under emulation]: token values are not computed, so gpemu's generation never sees EOS: greedy
# search and sampling run to their max length (Note [Absorbing operands] in ops.py). transformers' vectorised beam
# search (4.50 and later) decides on the device instead: after each step it reads
# `improvement_possible & exists_open_beam & valid_continuations`, where `improvement_possible` is an any() over
# computed scores (read False: Note [Sanity checks read back as passing]) and `valid_continuations` is
# `~all(stopping criteria hit)` over `max length reached | EOS seen` (the all() read True), so it stopped after one
# step; and its output is cropped to a generated length summed from the beam indices (computed: read 0), so it
# returned an empty (batch, 0) or a prompt-only sequence. run_summarization.py with `--num_beams 4` evaluated one
# decoder step per batch and its metrics read a generated length of 0. On a GPU, beams that never end in EOS run
# until `max_length`, where the max-length criterion (a host-known value) makes every continuation invalid, and all
# of the search's positions are kept. So inside `GenerationMixin._beam_search` a read of a computed 0-dim bool
# answers True (search on: the max-length flag, which is known, still ends the loop) and of a computed 0-dim integer
# `max_length`: the crop reads `prompt + generated` (which is max_length) to slice the sequences and then `generated`
# to slice the beam indices, whose width is `max_length - prompt`, so the larger answer keeps both whole. Reads of
# known values, bigger tensors and floats keep their usual answers, and so do a model's own all()/any() checks read
# inside the loop (`if torch.isnan(x).any()` still passes); the user's value hook answers first. The
# method is wrapped when transformers.generation.utils is imported (an import hook) or at install if it already is.


def _answers(max_length: int) -> Callable[[tuple[int, ...], torch.dtype, str], Any]:
    """Return the read answers of a beam search to `max_length` that never sees EOS."""

    def answer(shape: tuple[int, ...], dtype: torch.dtype, reason: str) -> Any:
        if shape != ():
            return None
        if dtype == torch.bool:
            return True
        if not dtype.is_floating_point and not dtype.is_complex:
            return max_length
        return None

    return answer


def _wrap_beam_search(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Return `_beam_search` whose reads of computed values assume EOS is never seen (Note [Beam search under
    emulation])."""
    signature = inspect.signature(orig)

    @functools.wraps(orig)
    def _beam_search(self: Any, input_ids: Any, *args: Any, **kwargs: Any) -> Any:
        config = signature.bind_partial(self, input_ids, *args, **kwargs).arguments.get("generation_config")
        max_length = getattr(config, "max_length", None)
        if not isinstance(input_ids, EmuTensor) or not isinstance(max_length, int):
            return orig(self, input_ids, *args, **kwargs)
        with read_answers(_answers(max_length)):
            return orig(self, input_ids, *args, **kwargs)

    return _beam_search


def _patch(module: ModuleType, patcher: Patcher) -> None:
    mixin = getattr(module, "GenerationMixin", None)
    if mixin is not None and "_beam_search" in mixin.__dict__ and hasattr(mixin, "_beam_search_has_unfinished_sequences"):
        patcher.set(mixin, "_beam_search", _wrap_beam_search(mixin.__dict__["_beam_search"]))


def apply(patcher: Patcher) -> None:
    """Wrap transformers' beam search now if it is imported, else when it is (Note [Beam search under emulation])."""
    patch_when_imported(_MODULE, _patch, patcher)
