"""A tiny misbehaving HTTP server for tests: things a real fleet (or a wrong URL) throws at the client.

    with FakeServer("not-openai") as srv:      # srv.url = "http://127.0.0.1:P/v1"
        ...

Modes:
  not-openai   answers every path with an HTML page (a web server, not an OpenAI-compatible API)
  auth         an OpenAI-like server that demands ``Authorization: Bearer <key>`` (401 otherwise, echoing the key
               it got like some real servers do); with the right key it behaves like ``ok``
  garbage      /v1/models is fine; the book request gets a proper title list, every other chat reply is prose
               that holds no list of titles
  stall        /v1/models is fine; chat streams two chunks, then goes silent for ``stall_s`` on the first
               ``stall_count`` requests, then answers normally
  retry-after  the first ``stall_count`` chat requests get 429 with ``Retry-After: retry_after``; then normal
  repeats      like ``ok``, but at temperature 0 every title list repeats its first title (as a small model does);
               at a temperature above 0 the titles are distinct
  loops        like ``ok``, but a section asked at temperature 0 streams one line over and over to its max_tokens
               (``section_chunk_delay`` between chunks), as a small model caught in a repetition loop does; at a
               temperature above 0 it is prose. ``loop_streams`` records, per looping stream, (chunks written, chunks
               it would have had): a client that stops reading early shows as fewer written
  loops-late   like ``loops``, but the looping answer first writes its section's prose (about 160 words), then the
               line over and over: a model that runs out of things to say
  signs-off    like ``ok``, but every section's prose is followed by a sign-off ("I hope this helps! ...") and talk
               to its max_tokens, as a chat model does; ``talk_streams`` records (chunks written, chunks in the answer)
  (every mode answers ``"stream": false`` with one chat.completion, the same text, after the same stall or delays)
  ok           a minimal well-behaved server: JSON title lists ("Part topic 1", "Chapter topic 1", "Section
               topic 1", ...) and prose; sections titled in ``fail_sections`` always come back empty
"""

from __future__ import annotations

import json
import random
import threading
import time

from local_http import LocalHTTPServer

from orchestrator.core.reply import Reply

# A small book's flags for the section modes ("loops", "loops-late", "signs-off"):
# --context none: the fake server would loop the book's brief too (a request at temperature 0 that is no title list)
# --no-distinct-titles: the fake server names the sections of both chapters alike, and the re-ask for distinct titles
# would be one more refused reply
BOOK_ARGS = ["--parts", "1", "--chapters", "2", "--sections", "3", "--max-tokens", "400", "--format", "md",
             "--context", "none", "--no-distinct-titles"]


def reply(text: str, finish: str = "length", attempt: int = 1) -> Reply:
    """A section's answer as a check sees it (one token each 4 characters)."""
    return Reply(text=text, finish_reason=finish, prompt_tokens=1, completion_tokens=len(text) // 4, backend="b",
                 t_start=0.0, t_first=0.1, t_end=0.2, attempt=attempt)


class FakeServer(LocalHTTPServer):
    def __init__(self, mode: str, *, key: str = "", stall_s: float = 30.0, stall_count: int = 1,
                 retry_after: float = 2.0, model: str = "fake-model", fail_sections: tuple[str, ...] = (),
                 section_chunk_delay: float = 0.0, strict_stream_options: int = 0, refuse_schema: bool = False):
        self.mode = mode
        self.refuse_schema = refuse_schema  # a 400 to a request with response_format, before anything else is read
        # a status (400, or 422: FastAPI's validation error) refusing stream_options.continuous_usage_stats, as a
        # server that validates the request and knows only include_usage does (0: the field is taken, and the usage
        # of a stream comes in its last event alone, whether asked or not)
        self.strict_stream_options = strict_stream_options
        self.key = key
        self.stall_s = stall_s
        self.stall_count = stall_count
        self.retry_after = retry_after
        self.model = model
        self.fail_sections = fail_sections  # section titles answered empty, every time
        self.section_chunk_delay = section_chunk_delay  # seconds between the chunks of a section (slow writing)
        self.sections_started = 0
        self.chat_requests: list[float] = []  # arrival times (time.monotonic())
        self.auth_seen: list[str] = []
        self.bodies: list[dict] = []  # every chat request's JSON body, in arrival order
        self.loop_streams: list[tuple[int, int]] = []  # mode "loops": (chunks written, chunks in the answer)
        self.talk_streams: list[tuple[int, int]] = []  # mode "signs-off": the same
        self._lock = threading.Lock()

    def _authorised(self, h) -> bool:
        if self.mode != "auth":
            return True
        got = h.headers.get("Authorization", "")
        self.auth_seen.append(got)
        if got == f"Bearer {self.key}":
            return True
        sent = got.removeprefix("Bearer ")
        body = {"error": {"message": f"Incorrect API key provided: {sent}", "type": "invalid_request_error",
                          "code": "invalid_api_key"}}
        self._send(h, 401, json.dumps(body).encode())
        return False

    def _get(self, h) -> None:
        if self.mode == "not-openai":
            self._send(h, 200, b"<html><body><h1>Welcome to nginx!</h1></body></html>", "text/html")
            return
        if not self._authorised(h):
            return
        if h.path.rstrip("/") == "/v1/models":
            body = {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "test"}]}
            self._send(h, 200, json.dumps(body).encode())
        else:
            self._send(h, 404, b'{"error": {"message": "not found"}}')

    def _post(self, h) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        if self.mode == "not-openai":
            self._send(h, 200, b"<html>hello</html>", "text/html")
            return
        if not self._authorised(h):
            return
        with self._lock:
            self.chat_requests.append(time.monotonic())
            n = len(self.chat_requests)
        try:
            req = json.loads(raw)
        except ValueError:
            self._send(h, 400, b'{"error": {"message": "bad json"}}')
            return
        with self._lock:
            self.bodies.append(req)
        if self.refuse_schema and req.get("response_format"):
            self._send(h, 400, b'{"error": {"message": "response_format json_schema is not supported"}}')
            return
        extra = sorted(set(req.get("stream_options") or {}) - {"include_usage"})
        if self.strict_stream_options and extra:
            msg = "Extra inputs are not permitted"
            if self.strict_stream_options == 422:
                body = {"detail": [{"type": "extra_forbidden", "loc": ["body", "stream_options", extra[0]], "msg": msg,
                                    "input": True}]}
            else:
                body = {"error": {"message": f"stream_options.{extra[0]}: {msg}", "type": "BadRequestError"}}
            self._send(h, self.strict_stream_options, json.dumps(body).encode())
            return
        if self.mode == "retry-after" and n <= self.stall_count:
            self._send(h, 429, b'{"error": {"message": "slow down"}}',
                       headers={"Retry-After": f"{self.retry_after:g}"})
            return
        text = self._answer(req)
        looping = (self.mode in ("loops", "loops-late") and not text.lstrip().startswith("{")
                   and not req.get("temperature"))
        if looping:  # one line over and over, to the request's token cap (about 4 characters a token)
            line = "The cache keeps every record near the server that asked for it.\n"
            size = 4 * int(req.get("max_tokens") or 520)
            text = ((text + "\n\n" if self.mode == "loops-late" else "") + line * (size // len(line) + 1))[:size]
        talking = self.mode == "signs-off" and not text.lstrip().startswith("{")
        if talking:  # a sign-off, then talk to the request's token cap (about 4 characters a token)
            rnd = random.Random(text)
            words = ("weather", "garden", "holiday", "recipe", "film", "concert", "train", "museum", "market", "river")
            size = 4 * int(req.get("max_tokens") or 520)
            text += "\n\nI hope this helps! Let me know if you have any questions."
            while len(text) < size:  # talk that does not repeat itself (no repetition loop for the checks to see)
                text += (f" Would you also like to hear about the {rnd.choice(words)} near the {rnd.choice(words)} "
                         f"and the {rnd.choice(words)}?")
            text = text[:size]
        delay = 0.0
        if not text.lstrip().startswith("{"):
            with self._lock:
                self.sections_started += 1
            delay = self.section_chunk_delay
        if req.get("stream") is not True:  # one whole response (a library's unstreamed sections)
            if self.mode == "stall" and n <= self.stall_count:
                time.sleep(self.stall_s)
            time.sleep(delay * max(1, len(text) // 16))
            self._whole(h, text, finish="length" if looping or talking else "stop")
            if looping:
                with self._lock:
                    self.loop_streams.append((-(-len(text) // 16),) * 2)  # read whole: every "chunk" sent
            return
        self._stream(h, text, stall=self.mode == "stall" and n <= self.stall_count, delay=delay,
                     finish="length" if looping or talking else "stop",
                     record=self.loop_streams if looping else self.talk_streams if talking else None)

    def _whole(self, h, text: str, finish: str = "stop") -> None:
        body = {"id": "x", "object": "chat.completion", "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
                "usage": {"prompt_tokens": 10, "completion_tokens": max(1, len(text) // 4),
                          "total_tokens": 10 + len(text) // 4}}
        try:
            self._send(h, 200, json.dumps(body).encode())
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _answer(self, req: dict) -> str:
        rf = req.get("response_format") or {}
        schema = (rf.get("json_schema") or {}).get("schema") or {}
        props = schema.get("properties") or {}
        items = props.get("items") or {}
        n = items.get("minItems") or items.get("maxItems")
        is_list = bool(props)
        content = " ".join(m.get("content", "") for m in req.get("messages", []))
        if not is_list and ("titles" in content.lower() and "list" in content.lower()):
            is_list = True
        if self.mode == "garbage" and not (is_list and "title" in props):
            return "I am sorry, but I would rather talk about the weather today. It is sunny."
        if self.fail_sections and not is_list and any(f'"{t}"' in content for t in self.fail_sections):
            return ""  # an empty answer: a failure, retried, and lost after the last attempt
        if is_list:
            count = int(n or 12)
            low = content.lower()
            level = "Section" if "section titles" in low else "Chapter" if "chapter titles" in low else "Part"
            body: dict = {"items": [f"{level} topic {i}" for i in range(1, count + 1)]}
            if self.mode == "repeats" and not req.get("temperature"):
                body["items"] = [f"{level} topic 1"] * count
            if "title" in props:
                body["title"] = "A Test Book"
            return json.dumps(body)
        # Prose that does not repeat itself (a repeated sentence is a repetition loop, re-asked by the runner), and
        # that differs from section to section (the same text twice is a near-duplicate, which --repairs asks again).
        rnd = random.Random(content)
        nouns = ("module", "queue", "request", "record", "schema", "cache", "branch", "release", "build", "test",
                 "server", "client", "index", "table", "stream", "worker", "token", "commit", "review", "deploy")
        verbs = ("shapes", "guards", "names", "splits", "checks", "keeps", "moves", "joins", "sorts", "limits")
        return " ".join(f"Point {i} of this section explains one more {w} side: each {rnd.choice(nouns)} "
                        f"{rnd.choice(verbs)} a {rnd.choice(nouns)} near the {rnd.choice(nouns)} {rnd.choice(verbs)} "
                        f"{rnd.choice(nouns)} code."
                        for i, w in enumerate(("first", "practical", "careful", "useful", "common", "subtle",
                                               "final", "extra"), 1))

    def _stream(self, h, text: str, stall: bool, delay: float = 0.0, finish: str = "stop",
                record: list[tuple[int, int]] | None = None) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        pieces = [text[i:i + 16] for i in range(0, len(text), 16)] or [""]
        written = 0
        try:
            for i, p in enumerate(pieces):
                chunk = {"id": "x", "object": "chat.completion.chunk", "model": self.model,
                         "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
                h.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                h.wfile.flush()
                written += 1
                if stall and i == 1:
                    time.sleep(self.stall_s)
                    return
                if delay:
                    time.sleep(delay)
            end = {"id": "x", "object": "chat.completion.chunk", "model": self.model,
                   "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
            usage = {"id": "x", "object": "chat.completion.chunk", "model": self.model, "choices": [],
                     "usage": {"prompt_tokens": 10, "completion_tokens": max(1, len(text) // 4),
                               "total_tokens": 10 + len(text) // 4}}
            h.wfile.write(b"data: " + json.dumps(end).encode() + b"\n\n")
            h.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
            h.wfile.write(b"data: [DONE]\n\n")
            h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            if record is not None:
                with self._lock:
                    record.append((written, len(pieces)))
        h.close_connection = True
