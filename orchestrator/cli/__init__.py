"""The ``handbook`` command line; no library module builds a parser."""

from .main import main

__all__ = ["main"]
