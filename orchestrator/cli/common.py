"""What the subcommands share and main.py needs too, so that no subcommand imports main (no import cycle)."""

from __future__ import annotations

import argparse
from typing import NoReturn

from ..core.errors import ConfigError

__all__ = ["OneLineParser"]


class OneLineParser(argparse.ArgumentParser):
    """Bad flags are bad input like any other: one line and exit 2 (our ConfigError), no usage dump."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)
