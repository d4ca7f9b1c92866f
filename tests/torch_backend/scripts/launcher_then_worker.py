"""A launcher in the style of torchrun's agent: it starts a Python worker that uses the GPU and exits after it."""

import subprocess
import sys

WORKER = "import torch; x = torch.randn(256, 256, device='cuda'); (x @ x).sum().item(); print('worker done')"

if __name__ == "__main__":
    subprocess.run([sys.executable, "-c", WORKER], check=True)
    print("launcher done")
