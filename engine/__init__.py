"""Parley's engine: model loading, turns, caches. Never imports Qt."""

import logging
import os
import sys

# torchao (int8/4-bit weights) registers enums with torch's pytree when transformers imports it,
# which logs a torch-internal deprecation warning on every command: nothing a user can act on
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)

# How long torch's OpenMP threads spin for the next parallel region before they sleep, set here,
# before torch loads (GNU OpenMP reads it once, as it loads): between a decode step's torch ops,
# numba's kernel threads (model/row_kernels.py) need the same cores. On a 2-core AMD EPYC VM
# (Zen 4) the int4 model at Qwen2-VL-2B's shape decoded 17-19 tok/s with torch's default spin,
# 25.6-27.8 with 2000, 19.5-24.2 with 20000; no spin (OMP_WAIT_POLICY=PASSIVE) 22.6-25.5, but bf16
# through torch's own kernels 8.6-9.2 against 9.7-11.6 by default and 11.1-13.8 at 2000. A value
# the user set wins; an entry that imports torch before the engine goes without. Other OpenMP
# runtimes (torch on Windows and macOS) are left as they are: not measured.
GOMP_SPINCOUNT = "2000"
if "torch" not in sys.modules:
    os.environ.setdefault("GOMP_SPINCOUNT", GOMP_SPINCOUNT)
