from __future__ import annotations

import os

import torch

# Triton kernels run in triton's interpreter where there is no GPU. Set before any kernel
# module is imported: triton reads the variable when a kernel is decorated.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
