"""The typesetter's pipe protocol, shared by the parent (typeset/pdf.py) and its workers (typeset/worker.py): each
message is an 8-byte little-endian length and that many bytes. Kept apart so the parent never imports the
worker's WeasyPrint."""

from __future__ import annotations

import struct
from typing import IO

NICE_ENV = "HANDBOOK_TYPESET_NICE"  # a worker started with this set lowers its priority by that much first


def frame(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def read_exact(stream: IO[bytes], n: int) -> bytes | None:
    """Exactly n bytes from a blocking binary stream, or None at end of stream."""
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def read_frame(stream: IO[bytes]) -> bytes | None:
    head = read_exact(stream, 8)
    if head is None:
        return None
    return read_exact(stream, struct.unpack("<Q", head)[0])
