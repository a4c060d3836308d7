"""Datasets the project generates itself: no downloads, the same bytes on every machine."""

from tpsim.data.reverse import ReverseTask

__all__ = ["ReverseTask"]
