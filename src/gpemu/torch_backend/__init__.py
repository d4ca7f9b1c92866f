"""Drop-in emulated CUDA for unmodified PyTorch scripts: install(), EmuTensor, the value hook.

    import gpemu.torch_backend as gt
    emu = gt.install(gpu="a100")          # cuda:0 is now an emulated A100
    ...                                   # the user's unmodified training code
    emu.devices[0].stats                  # what the report reads
"""

from gpemu.torch_backend.emulation import (
    current_emulation,
    install,
    install_from_env,
    parse_bytes,
    set_value_hook,
    uninstall,
)
from gpemu.torch_backend.phases import identify_model
from gpemu.torch_backend.state import Emulation
from gpemu.torch_backend.tensor import EmuTensor

__all__ = [
    "EmuTensor",
    "Emulation",
    "current_emulation",
    "identify_model",
    "install",
    "install_from_env",
    "parse_bytes",
    "set_value_hook",
    "uninstall",
]
