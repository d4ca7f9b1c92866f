"""Models and example batches for profiling: gpemu.workloads.models when present, else torchvision; tiny test nets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from gpemu.errors import UnknownNameError

IMAGE_SIZE = 224  # GPEmu's inputs are 3x224x224 fp32 for every vision model
NUM_CLASSES = 1000


def _tiny_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=4, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, NUM_CLASSES),
    )


def _tiny_mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * IMAGE_SIZE * IMAGE_SIZE, 16), nn.ReLU(), nn.Linear(16, NUM_CLASSES))


# Tiny models for dry runs and CI: same input/output contract as the torchvision classifiers, milliseconds per step.
TINY_MODELS: dict[str, Callable[[], nn.Module]] = {"tiny-cnn": _tiny_cnn, "tiny-mlp": _tiny_mlp}


@dataclass
class Workload:
    """A model with one example batch (on the host) and how it was built."""

    name: str
    model: nn.Module
    inputs: torch.Tensor
    targets: torch.Tensor
    origin: str  # "gpemu.workloads", "torchvision" or "tiny"


def _zoo() -> Any | None:
    try:
        from gpemu.workloads import models
    except ImportError:
        return None
    if hasattr(models, "build_model") and hasattr(models, "example_batch"):
        return models
    return None


def known_models() -> list[str]:
    """Return every model name build_workload accepts (the gpemu zoo's, else torchvision's, plus TINY_MODELS)."""
    zoo = _zoo()
    if zoo is not None and hasattr(zoo, "list_models"):
        names = list(zoo.list_models())
    else:
        import torchvision

        names = list(torchvision.models.list_models(module=torchvision.models))
    return names + list(TINY_MODELS)


def check_models(names: list[str]) -> None:
    """Raise UnknownNameError (with the closest names) for the first name build_workload would not know."""
    known = set(known_models())
    for name in names:
        if name not in known:
            raise UnknownNameError("model", name, known)


def vision_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return a random Bx3x224x224 fp32 image batch and int64 labels."""
    gen = torch.Generator().manual_seed(batch_size)
    inputs = torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE, generator=gen)
    targets = torch.randint(0, NUM_CLASSES, (batch_size,), generator=gen)
    return inputs, targets


def build_workload(name: str, batch_size: int, model: nn.Module | None = None) -> Workload:
    """Return the model `name` (random weights; `model` when given) and a `batch_size` example batch, on the host."""
    if name in TINY_MODELS:
        torch.manual_seed(0)
        return Workload(name, model if model is not None else TINY_MODELS[name](), *vision_batch(batch_size), origin="tiny")
    zoo = _zoo()
    if zoo is not None:
        inputs, targets = zoo.example_batch(name, batch_size)
        return Workload(name, model if model is not None else zoo.build_model(name), inputs, targets, origin="gpemu.workloads")
    import torchvision

    check_models([name])
    kwargs: dict[str, Any] = {"weights": None}
    if name in ("inception_v3", "googlenet"):
        kwargs["aux_logits"] = False  # GPEmu-style single-output training step
        kwargs["init_weights"] = True
    if model is None:
        model = torchvision.models.get_model(name, **kwargs)
    return Workload(name, model, *vision_batch(batch_size), origin="torchvision")


def logits_of(output: Any) -> torch.Tensor:
    """Return the logits tensor of a model output (a tensor, a namedtuple/tuple, or an object with .logits)."""
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits
    if isinstance(output, dict):
        return next(v for v in output.values() if isinstance(v, torch.Tensor))
    if isinstance(output, (tuple, list)):
        return logits_of(output[0])
    raise TypeError(f"cannot find logits in a model output of type {type(output).__name__}")


def loss_of(output: Any, targets: torch.Tensor) -> torch.Tensor:
    """Return the cross-entropy loss for classification (BxC) or token prediction (BxSxV) outputs."""
    logits = logits_of(output)
    if logits.dim() > 2:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
    return F.cross_entropy(logits.float(), targets)
