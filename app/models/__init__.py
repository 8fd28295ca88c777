"""Choosing and getting models: the model picker (model_picker, model_catalog: the demo, recent
folders, the Hugging Face cache) and the Models page (models_page, download_text).

`ModelsPage` is imported on first use: the window opens it only when asked.
May import: the root modules."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .model_picker import ModelPicker

if TYPE_CHECKING:
    from .models_page import ModelsPage

__all__ = ["ModelPicker", "ModelsPage"]


def __getattr__(name: str):
    if name == "ModelsPage":
        from .models_page import ModelsPage

        return ModelsPage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
