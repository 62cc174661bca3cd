"""Backend URLs: credentials split off, redacted for messages, normalised; power-exporter endpoints."""

from __future__ import annotations

import re
from urllib.parse import urlparse

from .errors import ConfigError

__all__ = ["normalise_url", "redact", "split_credentials", "split_power"]


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``http://user:pass@host:8000/v1`` -> (``http://host:8000/v1``, (user, pass)); other URLs unchanged."""
    if not isinstance(url, str):
        return url, None
    parsed = urlparse(url.strip())
    if "@" not in parsed.netloc:
        return url, None
    from urllib.parse import unquote

    userinfo, _, hostport = parsed.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    return parsed._replace(netloc=hostport).geturl(), (unquote(user), unquote(password))



def redact(url: str) -> str:
    """A URL fit for a message: whatever stands before an "@" in its authority is hidden."""
    return re.sub(r"^([a-zA-Z][\w+.-]*://)[^@]*@", r"\1***@", url.strip()) if "@" in url else url



def normalise_url(url: str) -> str:
    if not isinstance(url, str) or not url.strip():
        raise ConfigError("a backend URL is empty")
    u = url.strip().rstrip("/")
    if "@" in u:  # credentials split_credentials could not take apart: never quote them back
        url = redact(u)
    parsed = urlparse(u)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"malformed backend URL {url!r}: expected http(s)://HOST[:PORT]/v1")
    try:
        parsed.port  # noqa: B018 - raises on a non-numeric port
    except ValueError:
        raise ConfigError(f"malformed backend URL {url!r}: bad port") from None
    if not parsed.path.endswith("/v1"):
        raise ConfigError(f"backend URL {url!r} must end in /v1 (an OpenAI-compatible base URL)")
    return u



def split_power(spec: str) -> tuple[str, str | None]:
    """``http://h:9400/metrics#gpu=0`` -> (``http://h:9400/metrics``, ``"0"``); no path: ``/metrics``; no
    ``#gpu=``: (page, None). Anything else is a one-line ConfigError."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("a --power endpoint is empty: expected http(s)://HOST:PORT[/metrics][#gpu=LABEL]")
    page, _, frag = spec.strip().partition("#")
    parsed = urlparse(page)
    try:
        port_ok = parsed.port is None or parsed.port > 0
    except ValueError:  # a port that is not a number
        port_ok = False
    if parsed.scheme not in ("http", "https") or not parsed.hostname or not port_ok or "@" in parsed.netloc:
        raise ConfigError(f"malformed power endpoint {redact(spec)!r}: expected http(s)://HOST:PORT[/metrics]"
                          "[#gpu=LABEL] (a dcgm-exporter page)")
    gpu: str | None = None
    if frag:
        key, eq, label = frag.partition("=")
        if key != "gpu" or not eq or not label.strip():
            raise ConfigError(f"power endpoint {spec!r}: after '#' expected gpu=LABEL (dcgm's gpu index or UUID)")
        gpu = label.strip()
    page = parsed._replace(path="/metrics").geturl() if parsed.path in ("", "/") else page.rstrip("/")
    return page, gpu
