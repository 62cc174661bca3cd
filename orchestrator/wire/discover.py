"""Model discovery and validation (``discover``, through the openai SDK: not the hot path), the Authorization
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


async def discover(backend: Backend, api_key: str | None, wanted: str | None, *, timeout_s: float = 8.0) -> str:
    """Check that ``backend`` is an OpenAI-compatible server and return the model to use (through the openai SDK:
    not the hot path). ``timeout_s`` bounds the /models request.

    Raises BackendError (unreachable, not OpenAI-compatible, key refused) or ConfigError (unknown --model).
    The key itself is never part of a message.
    """
    import openai

    key = backend.api_key or api_key or "EMPTY"
    client = openai.AsyncOpenAI(
        base_url=backend.url, api_key=key, max_retries=0, timeout=timeout_s,
        default_headers={"Authorization": auth_header(backend, key)} if backend.auth else None,
    )
    try:
        page = await client.models.list()
        ids = [m.id for m in page.data if getattr(m, "id", None)]
    except openai.AuthenticationError:
        raise BackendError(
            f"{backend.url} refused the API key (HTTP 401); pass --api-key or set OPENAI_API_KEY"
        ) from None
    except openai.PermissionDeniedError:
        raise BackendError(f"{backend.url} refused the API key (HTTP 403)") from None
    except openai.APITimeoutError:
        raise BackendError(f"{backend.url} did not answer within {timeout_s:g} s") from None
    except openai.APIConnectionError as e:
        cause = e.__cause__ or e
        raise BackendError(f"cannot reach {backend.url}: {short_error(cause)}") from None
    except openai.NotFoundError:
        raise BackendError(f"{backend.url} is not an OpenAI-compatible server (no /models endpoint)") from None
    except (openai.APIStatusError, openai.APIResponseValidationError) as e:
        code = getattr(e, "status_code", None)
        raise BackendError(
            f"{backend.url} is not an OpenAI-compatible server ({'HTTP ' + str(code) if code else 'bad /models reply'})"
        ) from None
    except (ValueError, TypeError, AttributeError):
        raise BackendError(f"{backend.url} is not an OpenAI-compatible server (bad /models reply)") from None
    finally:
        await client.close()
    if not ids:
        raise BackendError(f"{backend.url} lists no models")
    want = backend.model or wanted
    if want is None:
        return ids[0]
    if want not in ids:
        raise ConfigError(f"model {want!r} is not served by {backend.url}; it offers: {', '.join(ids)}")
    return want
