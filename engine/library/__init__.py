"""The model library: a catalog of known-good VLMs, a memory-fit estimate from a repo's
config.json, the pre-download folder check, resumable verified downloads into the standard
Hugging Face cache, and the installed models (list, resolve a repo id offline, delete).

No Qt here; torch is imported only by the device-memory probe in `fit.free_device_memory`.
"""
