"""Helpers the tests share: running engines and servers, made-up KV caches, the window, platform
simulation. No test module imports another; they import these."""
