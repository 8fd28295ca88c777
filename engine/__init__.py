"""Parley's engine: model loading, turns, caches. Never imports Qt."""
