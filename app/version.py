"""Parley's version: Help ▸ About; packaging/parley.spec's CFBundleShortVersionString says the same."""

VERSION = "0.1.0"
