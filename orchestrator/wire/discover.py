"""Model discovery and validation (``discover``: one GET of /models a backend), the Authorization
header both it and the client send (``auth_header``), and the wording of an exception in a one-line message."""

from __future__ import annotations

from ..core.config import Backend
from ..core.errors import BackendError, ConfigError


def auth_header(backend: Backend, key: str) -> str:
    """HTTP basic auth when the backend URL carried user:password (a proxy in front of the server), else the
    OpenAI-style bearer key."""
    if backend.auth is not None:
        import base64

        token = base64.b64encode(f"{backend.auth[0]}:{backend.auth[1]}".encode()).decode()
        return f"Basic {token}"
    return f"Bearer {key}"


def short_error(e: BaseException) -> str:
    s = str(e) or type(e).__name__
    return " ".join(s.split())[:200]


_REFUSED = {
    401: "refused the API key (HTTP 401); pass --api-key or set OPENAI_API_KEY",
    403: "refused the API key (HTTP 403)",
    404: "is not an OpenAI-compatible server (no /models endpoint)",
}


async def discover(backend: Backend, api_key: str | None, wanted: str | None, *, timeout_s: float = 8.0) -> str:
    """Check that ``backend`` is an OpenAI-compatible server and return the model to use. ``timeout_s`` bounds the
    /models request.

    One GET of ``/models`` through aiohttp, the hot path's own HTTP library: the openai SDK did this before, and
    importing it (and building its httpx clients) cost about 0.75 s of every job's start on this machine, for one
    request a backend.

    Raises BackendError (unreachable, not OpenAI-compatible, key refused) or ConfigError (unknown --model).
    The key itself is never part of a message.
    """
    import aiohttp

    key = backend.api_key or api_key or "EMPTY"
    headers = {"Authorization": auth_header(backend, key), "Accept": "application/json"}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session, \
                session.get(f"{backend.url}/models", headers=headers) as resp:
            status = resp.status
            data = await resp.json(content_type=None) if status == 200 else None
    except TimeoutError:
        raise BackendError(f"{backend.url} did not answer within {timeout_s:g} s") from None
    except aiohttp.ClientResponseError as e:
        raise BackendError(f"{backend.url} is not an OpenAI-compatible server (HTTP {e.status})") from None
    except aiohttp.ClientError as e:
        raise BackendError(f"cannot reach {backend.url}: {short_error(e)}") from None
    except ValueError:  # not JSON
        raise BackendError(f"{backend.url} is not an OpenAI-compatible server (bad /models reply)") from None
    if status != 200:
        why = _REFUSED.get(status, f"is not an OpenAI-compatible server (HTTP {status})")
        raise BackendError(f"{backend.url} {why}")
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list):
        raise BackendError(f"{backend.url} is not an OpenAI-compatible server (bad /models reply)")
    ids = [m["id"] for m in models if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]]
    if not ids:
        raise BackendError(f"{backend.url} lists no models")
    want = backend.model or wanted
    if want is None:
        return ids[0]
    if want not in ids:
        raise ConfigError(f"model {want!r} is not served by {backend.url}; it offers: {', '.join(ids)}")
    return want
