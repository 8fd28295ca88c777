"""The commands without a window: `ask`, `serve` and `replay`, and the options they share. Torch
is imported only when a command starts the built-in engine.
May import: every room (api, local, remote, library and below); nothing imports headless."""
