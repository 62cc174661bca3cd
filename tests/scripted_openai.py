"""An OpenAI-compatible server whose every chat reply is chosen by the test: what real servers and real models send.

    def answer(req: Request) -> Answer:
        if req.kind == "chapter" and req.title == "Basics":
            return Answer('Here is the outline:\n```json\n{"items": ["A", "B"]}\n```\nLet me know!')
        return Answer(f"About {req.title}. " * 10)

    with ScriptedServer(answer) as srv:      # srv.url = "http://127.0.0.1:P/v1"
        ...

``Request`` says what the orchestrator asked (book, part or chapter planning, the book's brief, or a section, with
the node's title,
the how-many-th request for that node this is, and the body). ``Answer`` says what comes back: the text streamed
in small chunks, the finish reason (or none at all), usage or not, an HTTP error instead, a delay before the
first chunk, or a stream that stops sending after some characters (a hang, until the client gives up).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from local_http import LocalHTTPServer

_KINDS = (
    ("chapter", re.compile(r'section titles for chapter "(.*?)"')),
    ("part", re.compile(r'chapter titles for part "(.*?)"')),
    ("section", re.compile(r'Write the section "(.*?)"')),
    ("section", re.compile(r'^Explain "(.*?)"', re.MULTILINE)),  # the small profile's section request
    ("book", re.compile(r'planning a long book for this request: "(.*?)"')),
    # the book brief (--context outline, templates/prompts/brief*.j2): its title is the request's text
    ("brief", re.compile(r'book brief for a long book being written for this request: "(.*?)"')),
    ("brief", re.compile(r"Write a short book brief for (.*?) in about")),
)


@dataclass
class Request:
    kind: str  # book, part, chapter, brief, section (or "other")
    title: str  # the node's title (the request's text for the book node)
    nth: int  # 1 for the first request for this (kind, title), 2 for the next...
    body: dict
    prompt: str
    headers: dict[str, str] = field(default_factory=dict)
    t: float = field(default_factory=time.monotonic)  # when it arrived


@dataclass
class Answer:
    text: str = ""
    finish_reason: str | None = "stop"
    status: int = 200
    error: str = ""
    delay_s: float = 0.0  # before the first chunk
    hang_after: int | None = None  # stop sending after this many characters (and hold the connection)
    usage: bool = True
    done: bool = True  # send "data: [DONE]"
    chunk: int = 8
    pause_at: int | None = None  # after this many characters, wait ``pause_s`` before the rest
    pause_s: float = 0.0


class ScriptedServer(LocalHTTPServer):
    def __init__(self, answer: Callable[[Request], Answer], model: str = "scripted-model"):
        self.answer = answer
        self.model = model
        self.requests: list[Request] = []
        self.models_gets = 0
        self.hosts: list[str] = []
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def of(self, kind: str) -> list[Request]:
        return [r for r in self.requests if r.kind == kind]

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()  # release streams held open (hang_after) before the server shuts down
        super().__exit__(*exc)

    def _get(self, h) -> None:
        with self._lock:
            self.hosts.append(h.headers.get("Host", ""))
        if h.path.rstrip("/") == "/v1/models":
            with self._lock:
                self.models_gets += 1
            body = {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "test"}]}
            self._send(h, 200, json.dumps(body).encode())
        else:
            self._send(h, 404, b'{"error": {"message": "not found"}}')

    def _post(self, h) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = json.loads(h.rfile.read(length) or b"{}")
        prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        kind, title = "other", ""
        for k, pat in _KINDS:
            m = pat.search(prompt)
            if m:
                kind, title = k, m.group(1)
                break
        with self._lock:
            n = self._counts[(kind, title)] = self._counts.get((kind, title), 0) + 1
            req = Request(kind, title, n, body, prompt, dict(h.headers.items()))
            self.requests.append(req)
        a = self.answer(req)
        if a.status != 200:
            self._send(h, a.status, json.dumps({"error": {"message": a.error or "error", "code": a.status}}).encode())
            return
        if a.delay_s:
            self._stopping.wait(a.delay_s)
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        text = a.text if a.hang_after is None else a.text[: a.hang_after]
        try:
            for i in range(0, len(text), a.chunk):
                if a.pause_at is not None and i <= a.pause_at < i + a.chunk:
                    self._stopping.wait(a.pause_s)
                self._event(h, {"choices": [{"index": 0, "delta": {"content": text[i:i + a.chunk]},
                                             "finish_reason": None}]})
            if a.hang_after is not None:
                self._stopping.wait(600)  # hold the stream open, silent, until the client gives up or we stop
                return
            if a.finish_reason is not None:
                self._event(h, {"choices": [{"index": 0, "delta": {}, "finish_reason": a.finish_reason}]})
            if a.usage:
                ct = max(1, len(a.text) // 4)
                self._event(h, {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": ct,
                                                         "total_tokens": 10 + ct}})
            if a.done:
                h.wfile.write(b"data: [DONE]\n\n")
            h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        h.close_connection = True

    def _event(self, h, obj: dict) -> None:
        obj = {"id": "x", "object": "chat.completion.chunk", "created": int(time.time()), "model": self.model, **obj}
        h.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        h.wfile.flush()


def titles(items: list[str], title: str | None = None) -> str:
    """A planning reply in the JSON shape the planner asks for."""
    body: dict = {"items": items}
    if title is not None:
        body = {"title": title, **body}
    return json.dumps(body)


def prose(title: str, words: int = 40) -> str:
    """A section that names its own title, so a test can tell which heading a text was written for. Its sentences
    are drawn from a vocabulary by a seed of the title: two sections never nearly duplicate each other (the repairs
    would ask one of them again), and the same title always gets the same text."""
    import random

    rnd = random.Random(title)
    nouns = ("module", "queue", "request", "record", "schema", "cache", "branch", "release", "build", "test",
             "server", "client", "index", "table", "stream", "worker", "token", "commit", "review", "deploy")
    verbs = ("shapes", "guards", "names", "splits", "checks", "keeps", "moves", "joins", "sorts", "limits")
    filler = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")
    body = " ".join(f"The {w} point: each {rnd.choice(nouns)} {rnd.choice(verbs)} a {rnd.choice(nouns)} near the "
                    f"{rnd.choice(nouns)} {rnd.choice(verbs)} {rnd.choice(nouns)} code."
                    for w in filler[: max(1, words // 10)])
    return f"This section is about {title}. {body}"
