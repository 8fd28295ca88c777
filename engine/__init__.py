"""Parley's engine: model loading, turns, caches. Never imports Qt."""

import logging

# torchao (int8/4-bit weights) registers enums with torch's pytree when transformers imports it,
# which logs a torch-internal deprecation warning on every command: nothing a user can act on
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
