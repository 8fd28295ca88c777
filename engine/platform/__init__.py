"""Every OS-specific file call (atomic writes, positional I/O, locks, durability) and Parley's paths
(data folder, private files, the demo model). Torch-free.
May import: nothing else in engine/ (the bottom room)."""
