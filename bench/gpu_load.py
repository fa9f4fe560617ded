"""gpu_load: a training-like load on GPU 0, for acceptance runs beside a busy job.

Needs PyTorch; bench/real_gpu.py runs it under `pciebw` when PyTorch is there.

    python bench/gpu_load.py MODE SECONDS      # e.g. h2d 40

MODE `h2d` copies 512 MiB of pinned host memory to the GPU in a loop (a data loader);
`compute` runs bf16 8192 x 8192 matmuls; `both` does both on two streams. HOLD_GIB
(environment) holds that much more GPU memory. It prints "busy: started MODE" once the
load runs and "busy: done N" at the end.
"""

from __future__ import annotations

import os
import sys
import time

import torch


def main(mode: str, seconds: float) -> None:
    dev = torch.device("cuda:0")
    host = torch.empty(512 << 20, dtype=torch.uint8).pin_memory()
    gpu = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn_like(a)
    hold = torch.empty(int(os.environ.get("HOLD_GIB", "0")) << 30, dtype=torch.uint8,
                       device=dev)
    copies, matmuls = torch.cuda.Stream(), torch.cuda.Stream()
    end, n = time.time() + seconds, 0
    print("busy: started", mode, flush=True)
    while time.time() < end:
        if mode in ("h2d", "both"):
            with torch.cuda.stream(copies):
                gpu.copy_(host, non_blocking=True)
        if mode in ("compute", "both"):
            with torch.cuda.stream(matmuls):
                a @ b  # the work is the point: the result is thrown away
        n += 1
        if n % 20 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    del hold
    print("busy: done", n, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
