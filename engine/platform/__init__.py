"""Every OS-specific file call (atomic writes, positional I/O, locks, durability, the open-file
limit), Parley's paths (data folder, private files, the demo model), and text from outside made
safe for a terminal (terminal). Torch-free.
May import: nothing else in engine/ (the bottom room)."""
