"""Deterministic text for the simulator: "temperature 0" answers built from word

An answer depends only on the request (model, messages, max_tokens, response_format): its hash seeds a
``random.Random``. Three kinds of answer:

* JSON when ``response_format`` carries a JSON schema (objects, strings, arrays with minItems/maxItems);
* a numbered list of titles when the last user message asks for "exactly N" things (with a ``Title:`` line
  first when it also asks for a book title);
* Markdown prose otherwise: paragraphs, sometimes a bullet list, fenced code (~0.92 blocks per answer, 3 in 4
  Python and always valid), with a log-normal length around ``LENGTH_FACTOR x`` the "about W words" asked, so
  that at 250 words and a 520-token cap the mean is ~288 words and ~7% of answers hit the cap.

Calibrated with :func:`simulate_book` (8 x 12 x 16, 250 words, 520 tokens) against the reference run: 1.42 tokens
per word, 288 words per section, ~7% truncated, ~46 of 1,536 section titles repeated, ~0.91 code blocks.

Tokens are text pieces (:func:`tokenize`): the concatenation of the pieces is the text, and the number of
pieces is what usage reports, about 1.42 per whitespace-separated word on prose.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import string
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

# --------------------------------------------------------------------------------------------------------------
# tokenisation

WORD_PIECE = 8  # most letters in one piece: longer words become several pieces (calibrated: ~1.42 per word)
_PIECE_RE = re.compile(rf" ?[A-Za-z]{{1,{WORD_PIECE}}}|[A-Za-z]{{1,{WORD_PIECE}}}| ?\d{{1,3}}|\n+| +"
                       r"|[^\sA-Za-z\d]{1,2}|\s")


def tokenize(text: str) -> list[str]:
    """Split text into pieces ("tokens"); ``"".join(tokenize(t)) == t`` for every string.

    Every character matches one of the alternatives, so the pieces cover the text without gaps.
    """
    return _PIECE_RE.findall(text)


def count_prompt_tokens(messages: Any) -> int:
    """About 1.3 tokens per word of every message (plus a few for the chat template)."""
    words = 0
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict):
                c = m.get("content")
                if isinstance(c, str):
                    words += len(c.split())
                elif isinstance(c, list):
                    for part in c:
                        if isinstance(part, dict) and isinstance(part.get("text"), str):
                            words += len(part["text"].split())
    return max(1, round(words * 1.3) + 4 * (len(messages) if isinstance(messages, list) else 1))


# --------------------------------------------------------------------------------------------------------------
# the answer of one request


@dataclass(frozen=True)
class Answer:
    kind: str  # "json", "list", "prose"
    pieces: tuple[str, ...]  # the full, natural answer (before max_tokens)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


_CACHE: OrderedDict[bytes, Answer] = OrderedDict()
_CACHE_MAX = 2048  # ~20 KB each


def request_key(model: str, body: dict, salt: int | None = None) -> bytes:
    key = [model, body.get("messages"), body.get("max_tokens", body.get("max_completion_tokens")),
           body.get("response_format"), body.get("guided_json"), body.get("seed"), salt]
    return hashlib.blake2b(orjson.dumps(key, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()


def answer(model: str, body: dict, salt: int | None = None) -> Answer:
    """The deterministic answer to a chat request (cached). ``salt`` (the server's --seed) varies all answers."""
    key = request_key(model, body, salt)
    a = _CACHE.get(key)
    if a is not None:
        _CACHE.move_to_end(key)
        return a
    a = _compose(key, body)
    _CACHE[key] = a
    if len(_CACHE) > _CACHE_MAX:
        _CACHE.popitem(last=False)
    return a


def schema_of(body: dict) -> dict | None:
    rf = body.get("response_format")
    if isinstance(rf, dict):
        if rf.get("type") == "json_schema":
            js = rf.get("json_schema") or {}
            sch = js.get("schema") if isinstance(js, dict) else None
            return sch if isinstance(sch, dict) else {"type": "object"}
        if rf.get("type") == "json_object":
            return {"type": "object"}
    gj = body.get("guided_json")
    if isinstance(gj, dict):
        return gj
    if isinstance(gj, str):
        try:
            v = orjson.loads(gj)
            return v if isinstance(v, dict) else None
        except orjson.JSONDecodeError:
            return None
    return None


def _last_user(messages: Any) -> str:
    if isinstance(messages, list):
        for m in reversed(messages):
            if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str):
                return m["content"]
        for m in reversed(messages):
            if isinstance(m, dict) and isinstance(m.get("content"), str):
                return m["content"]
    return ""


def _all_text(messages: Any) -> str:
    if isinstance(messages, list):
        return "\n".join(m["content"] for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str))
    return ""


_EXACTLY_RE = re.compile(r"exactly (\d+)", re.IGNORECASE)
_WORDS_RE = re.compile(r"about (\d+) words", re.IGNORECASE)
_QUOTED_RE = re.compile(r"\"([^\"\n]{1,200})\"|“([^”\n]{1,200})”")


def _compose(key: bytes, body: dict) -> Answer:
    rng = random.Random(key)
    messages = body.get("messages")
    last = _last_user(messages)
    everything = _all_text(messages)
    ctx = Context.from_prompt(last, everything)
    schema = schema_of(body)
    if schema is not None:
        n = _exactly(last)
        value = _fill_schema(schema, rng, ctx, n, name="")
        text = orjson.dumps(value).decode()
        return Answer("json", tuple(tokenize(text)))
    n = _exactly(last)
    if n is not None:
        titles = make_titles(rng, ctx, n)
        lines = []
        if "book title" in last.lower():
            lines.append(f"Title: {make_book_title(rng, ctx)}")
        lines += [f"{i}. {t}" for i, t in enumerate(titles, 1)]
        return Answer("list", tuple(tokenize("\n".join(lines))))
    m = _WORDS_RE.search(last)
    words = int(m.group(1)) if m else 250
    return Answer("prose", tuple(tokenize(make_prose(rng, ctx, words))))


def _exactly(text: str) -> int | None:
    m = _EXACTLY_RE.search(text)
    if not m:
        return None
    return max(0, min(int(m.group(1)), 1000))


# --------------------------------------------------------------------------------------------------------------
# what the prompt is about


@dataclass(frozen=True)
class Context:
    level: str  # "part", "chapter", "section", "title" or "" (what a list is of)
    quoted: tuple[str, ...]  # parent names found in the prompt, in order
    concept: str  # the subject the answer is about
    subject: str  # the most specific quoted name (e.g. the section title), or the concept

    @classmethod
    def from_prompt(cls, last: str, everything: str) -> Context:
        low = last.lower()
        level = ""
        m = re.search(r"exactly \d+\s+(?:[\w-]+\s+){0,3}?(parts?|chapters?|sections?|titles?|topics?)\b", low)
        if m:
            level = m.group(1).rstrip("s")
        else:
            for lv in ("section", "chapter", "part"):
                if lv in low:
                    level = lv
                    break
        quoted = tuple(next(g for g in q if g) for q in _QUOTED_RE.findall(last))
        concept = find_concept(" ".join(quoted[::-1]) or last) or find_concept(everything) or ""
        subject = quoted[-1] if quoted else (concept or "software engineering")
        if level == "title":
            level = "section" if "section" in low else ("chapter" if "chapter" in low else "part")
        if level == "topic":
            level = "section"
        return cls(level, quoted, concept, subject)


# --------------------------------------------------------------------------------------------------------------
# titles

# share of section titles drawn from the shared pool of generic titles (calibrated: ~46 of 1,536 repeat)
SECTION_COMMON_P = 0.065


def make_book_title(rng: random.Random, ctx: Context) -> str:
    return rng.choice(BOOK_TITLES)


def make_titles(rng: random.Random, ctx: Context, n: int) -> list[str]:
    """``n`` distinct titles for the children of the node named in the prompt."""
    seen: set[str] = set()
    out: list[str] = []
    level = ctx.level or "section"
    tries = 0
    deck: list[str] = []
    while len(out) < n:
        tries += 1
        if level == "part":
            t = _part_title(rng, len(out), tries)
        elif level == "chapter":
            if not deck:  # every concept of the area once before any repeats
                deck = list(concepts_near(ctx.concept or ctx.subject, rng))
                rng.shuffle(deck)
            t = _chapter_title(rng, deck.pop())
        else:
            t = _section_title(rng, ctx)
        if tries > 50 * (n + 1):
            t = f"{t} ({len(out) + 1})"
        k = t.lower()
        if k in seen:
            continue
        seen.add(k)
        out.append(t)
    return out


def _part_title(rng: random.Random, i: int, tries: int) -> str:
    if tries <= 3 * len(PART_THEMES):
        return rng.choice(PART_THEMES)
    return f"{rng.choice(PART_THEMES)} and {rng.choice(CONCEPTS)}"


def _chapter_title(rng: random.Random, concept: str) -> str:
    return rng.choice(CHAPTER_PATTERNS).format(c=concept, q=rng.choice(QUALIFIERS))


def _section_title(rng: random.Random, ctx: Context) -> str:
    if rng.random() < SECTION_COMMON_P:
        return rng.choice(COMMON_SECTIONS)
    c = ctx.concept if ctx.concept in _CONCEPT_NAME_SET else rng.choice(concepts_near(ctx.concept, rng))
    if rng.random() < 0.3:
        c = rng.choice(concepts_near(c, rng))
    pat = rng.choice(SECTION_PATTERNS)
    o, o2 = rng.sample(OBJECTS, 2)
    return pat.format(c=c, o=o, o2=o2, a=rng.choice(ACTIONS), q=rng.choice(QUALIFIERS))


def _fill_schema(schema: Any, rng: random.Random, ctx: Context, n: int | None, name: str, depth: int = 0) -> Any:
    if not isinstance(schema, dict) or depth > 6:
        return make_titles(rng, ctx, 1)[0]
    if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    for comb in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(comb), list) and schema[comb]:
            return _fill_schema(schema[comb][0], rng, ctx, n, name, depth + 1)
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "string")
    if t is None:
        t = "object" if "properties" in schema else ("array" if "items" in schema else "string")
    if t == "object":
        props = schema.get("properties")
        if not isinstance(props, dict) or not props:
            return {"titles": make_titles(rng, ctx, n or 5)}
        return {k: _fill_schema(v, rng, ctx, n, k, depth + 1) for k, v in props.items()}
    if t == "array":
        lo = schema.get("minItems")
        hi = schema.get("maxItems")
        if isinstance(hi, int):
            count = hi
        elif isinstance(lo, int):
            count = max(lo, n or lo)
        else:
            count = n if n is not None else 5
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {"type": "string"}
        it = items.get("type")
        if it == "string" and "enum" not in items:
            sub = ctx
            lv = _level_from_name(name)
            if lv:
                sub = Context(lv, ctx.quoted, ctx.concept, ctx.subject)
            return make_titles(rng, sub, count)
        return [_fill_schema(items, rng, ctx, None, name, depth + 1) for _ in range(count)]
    if t == "string":
        low = name.lower()
        if "book" in low or low in ("title", "name"):
            return make_book_title(rng, ctx)
        if "summary" in low or "description" in low:
            return _sentence(rng, _Slots(rng, ctx))
        return make_titles(rng, ctx, 1)[0]
    if t == "integer":
        return int(schema.get("minimum", 1))
    if t == "number":
        return float(schema.get("minimum", 1.0))
    if t == "boolean":
        return True
    if t == "null":
        return None
    return ""


def _level_from_name(name: str) -> str:
    low = name.lower()
    for lv in ("part", "chapter", "section"):
        if lv in low:
            return lv
    return ""


# --------------------------------------------------------------------------------------------------------------
# prose

LENGTH_FACTOR = 1.17  # median-ish natural words / asked words (calibrated: mean 288 of 250 after the cap)
LENGTH_SPREAD = 0.165  # log-normal sigma of the natural length (calibrated: ~7% over 520 tokens at 250 words)
CODE_BLOCK_PROBS = (0.17, 0.74, 0.09)  # 0, 1, 2 code blocks (calibrated to ~0.91 per section)


class _Slots:
    """Fillers for sentence templates, biased towards the section's subject."""

    def __init__(self, rng: random.Random, ctx: Context):
        self.rng = rng
        self.subject = ctx.subject.strip().rstrip(".:")
        self.concept = ctx.concept or find_concept(self.subject) or rng.choice(CONCEPTS)
        self.near = concepts_near(self.concept, rng)
        self._deck: list[str] = []

    def next_template(self) -> str:
        """Sentence templates without repeats within one answer (until the bank is used up)."""
        if not self._deck:
            self._deck = list(SENTENCES)
            self.rng.shuffle(self._deck)
        return self._deck.pop()

    def fill(self, template: str) -> str:
        r = self.rng
        names = _SLOTS_OF.get(template)
        if names is None:
            names = _SLOTS_OF[template] = tuple(f for _, f, _, _ in string.Formatter().parse(template) if f)
        if not names:
            return template
        values = {}
        for k in names:
            if k in values:
                continue
            if k == "s":
                v = self.subject.lower() if r.random() < 0.5 else self.concept.lower()
            elif k == "S":
                v = self.subject
            elif k == "c":
                v = self.concept.lower()
            elif k == "c2":
                v = r.choice(self.near).lower()
            else:
                v = r.choice(_SLOT_BANKS[k])
            values[k] = v
        return template.format(**values)


_SLOTS_OF: dict[str, tuple[str, ...]] = {}


def _sentence(rng: random.Random, slots: _Slots) -> str:
    s = slots.fill(slots.next_template())
    return s[0].upper() + s[1:]


def _paragraph(rng: random.Random, slots: _Slots, lo: int = 3, hi: int = 5) -> str:
    return " ".join(_sentence(rng, slots) for _ in range(rng.randint(lo, hi)))


def _bullets(rng: random.Random, slots: _Slots) -> str:
    intro = slots.fill(rng.choice(LIST_INTROS))
    items = []
    for _ in range(rng.randint(3, 5)):
        lead = slots.fill(rng.choice(BULLET_LEADS))
        items.append(f"- **{lead[0].upper() + lead[1:]}**: {_sentence(rng, slots)}")
    return intro[0].upper() + intro[1:] + "\n\n" + "\n".join(items)


def _code(rng: random.Random, slots: _Slots) -> str:
    lang, body = snippet(rng, slots.concept, slots.subject)
    intro = slots.fill(rng.choice(CODE_INTROS))
    return f"{intro[0].upper() + intro[1:]}\n\n```{lang}\n{body.rstrip()}\n```"


def natural_words(rng: random.Random, asked: int) -> int:
    """The length this answer 'wants', before any max_tokens cap."""
    mu = math.log(asked * LENGTH_FACTOR) - LENGTH_SPREAD**2 / 2
    return max(20, round(math.exp(rng.gauss(mu, LENGTH_SPREAD))))


def make_prose(rng: random.Random, ctx: Context, asked_words: int) -> str:
    slots = _Slots(rng, ctx)
    target = natural_words(rng, asked_words)
    u = rng.random()
    n_code = 0 if u < CODE_BLOCK_PROBS[0] else (1 if u < CODE_BLOCK_PROBS[0] + CODE_BLOCK_PROBS[1] else 2)
    blocks: list[str] = [_paragraph(rng, slots, 3, 4)]
    plan: list[str] = ["code"] * n_code
    if rng.random() < 0.35:
        plan.append("list")
    rng.shuffle(plan)
    words = len(blocks[0].split())
    for kind in plan:
        if kind == "code":
            b = _code(rng, slots)
        else:
            b = _bullets(rng, slots)
        blocks.append(b)
        words += len(b.split())
        if words < target * 0.8:
            p = _paragraph(rng, slots, 2, 3)
            blocks.append(p)
            words += len(p.split())
    closing: list[str] = []
    while words < target - 12:
        s = _sentence(rng, slots)
        closing.append(s)
        words += len(s.split())
        if len(closing) >= rng.randint(4, 6):
            blocks.append(" ".join(closing))
            closing = []
    if closing:
        blocks.append(" ".join(closing))
    if blocks[-1].endswith("```") or blocks[-1].startswith("- ") or "\n- " in blocks[-1]:
        blocks.append(slots.fill(rng.choice(CLOSERS)))
    return "\n\n".join(blocks)


# --------------------------------------------------------------------------------------------------------------
# word banks

BOOK_TITLES = [
    "The Working Software Engineer's Handbook",
    "Software Engineering from First Principles to Production",
    "The Complete Software Engineering Handbook",
    "Building Software That Lasts: A Practitioner's Handbook",
    "The Craft of Software Engineering",
    "Engineering Software at Every Scale",
    "The Pragmatic Handbook of Software Engineering",
    "Software Engineering in Practice: Every Topic, With Examples",
]

AREAS: dict[str, list[str]] = {
    "foundations": ["Algorithms", "Data Structures", "Complexity Analysis", "Recursion", "Hash Tables",
                    "Graph Algorithms", "Sorting and Searching", "Memory Management", "Concurrency Primitives",
                    "Type Systems", "Functional Programming", "Object-Oriented Design"],
    "design": ["Software Architecture", "Design Patterns", "Domain-Driven Design", "Modular Design",
               "API Design", "Dependency Injection", "Event-Driven Architecture", "Hexagonal Architecture",
               "Microservices", "Monoliths", "Interface Design", "Coupling and Cohesion"],
    "practice": ["Clean Code", "Refactoring", "Code Review", "Naming", "Error Handling", "Logging",
                 "Documentation", "Version Control", "Branching Strategies", "Technical Debt",
                 "Code Style", "Pair Programming"],
    "testing": ["Unit Testing", "Integration Testing", "Test-Driven Development", "Property-Based Testing",
                "Mocking", "Test Fixtures", "End-to-End Testing", "Mutation Testing", "Contract Testing",
                "Load Testing", "Test Coverage", "Flaky Tests"],
    "data": ["Relational Databases", "SQL", "Indexing", "Transactions", "Schema Migrations", "NoSQL Stores",
             "Data Modeling", "Caching", "Query Optimization", "Replication", "Sharding", "Data Pipelines"],
    "distributed": ["Distributed Systems", "Consensus", "Message Queues", "Remote Procedure Calls",
                    "Idempotency", "Eventual Consistency", "Service Discovery", "Load Balancing",
                    "Backpressure", "Retries and Timeouts", "Circuit Breakers", "Rate Limiting"],
    "delivery": ["Continuous Integration", "Continuous Delivery", "Build Systems", "Containers",
                 "Infrastructure as Code", "Release Management", "Feature Flags", "Dependency Management",
                 "Deployment Strategies", "Configuration Management", "Artifact Repositories",
                 "Environment Parity"],
    "security": ["Threat Modeling", "Authentication", "Authorization", "Secrets Management", "Input Validation",
                 "Cryptography Basics", "Secure Defaults", "Dependency Auditing", "Access Control",
                 "Session Management", "Security Testing", "Incident Disclosure"],
    "performance": ["Profiling", "Benchmarking", "Latency", "Throughput", "Memory Profiling",
                    "Asynchronous I/O", "Parallelism", "Capacity Planning", "Performance Budgets",
                    "Connection Pooling", "Batching", "Hot Paths"],
    "operations": ["Observability", "Monitoring", "Alerting", "Incident Response", "Postmortems",
                   "Service Level Objectives", "Tracing", "Metrics", "On-Call Practices", "Runbooks",
                   "Chaos Engineering", "Disaster Recovery"],
    "process": ["Agile Methods", "Estimation", "Requirements Engineering", "Technical Leadership",
                "Roadmapping", "Team Communication", "Onboarding", "Mentoring", "Architecture Decision Records",
                "Stakeholder Management", "Retrospectives", "Engineering Metrics"],
    "frontend": ["Web Fundamentals", "Accessibility", "State Management", "Component Design",
                 "Client-Side Performance", "Responsive Design", "Browser APIs", "Frontend Testing",
                 "Internationalization", "Design Systems", "Progressive Enhancement", "Web Security"],
    "ml": ["Machine Learning Systems", "Feature Stores", "Model Serving", "Data Validation",
           "Experiment Tracking", "Model Monitoring", "Training Pipelines", "Evaluation Metrics",
           "Reproducibility", "Inference Optimization", "Data Labeling", "Responsible AI"],
    "evolution": ["Legacy Systems", "Migrations", "Deprecation", "Backward Compatibility", "API Versioning",
                  "Rewrites", "Strangler Fig Pattern", "Code Ownership", "Long-Term Maintenance",
                  "Open Source Maintenance", "Software Licensing", "Sustainable Pace"],
}

PART_AREAS: dict[str, str] = {
    "Foundations of Computing": "foundations",
    "Software Design and Architecture": "design",
    "Writing Maintainable Code": "practice",
    "Testing and Quality Assurance": "testing",
    "Data and Storage": "data",
    "Distributed Systems": "distributed",
    "Building, Shipping and Delivery": "delivery",
    "Security Engineering": "security",
    "Performance and Scalability": "performance",
    "Reliability and Operations": "operations",
    "Process, People and Leadership": "process",
    "Frontend Engineering": "frontend",
    "Machine Learning in Production": "ml",
    "Maintenance and Evolution": "evolution",
}
PART_THEMES = list(PART_AREAS)
CONCEPTS = [c for cs in AREAS.values() for c in cs]
_CONCEPT_AREA = {c.lower(): a for a, cs in AREAS.items() for c in cs}
_PART_AREA = {p.lower(): a for p, a in PART_AREAS.items()}
_CONCEPT_RE = re.compile("|".join(re.escape(x) for x in sorted(_CONCEPT_AREA, key=len, reverse=True)), re.IGNORECASE)
_PART_RE = re.compile("|".join(re.escape(x) for x in sorted(_PART_AREA, key=len, reverse=True)), re.IGNORECASE)
_CONCEPT_NAME = {c.lower(): c for c in CONCEPTS}
_CONCEPT_NAME_SET = frozenset(CONCEPTS)
_PART_NAME = {p.lower(): p for p in PART_THEMES}


def find_concept(text: str) -> str:
    """The first known concept named in ``text`` (else a part theme), as spelled in the banks; "" if none."""
    if not text:
        return ""
    m = _CONCEPT_RE.search(text)
    if m:
        return _CONCEPT_NAME[m.group().lower()]
    m = _PART_RE.search(text)
    if m:
        return _PART_NAME[m.group().lower()]
    return ""


def concepts_near(concept: str, rng: random.Random) -> list[str]:
    """Concepts of the same area as ``concept`` (a concept or a part theme); all concepts when unknown."""
    low = (concept or "").lower()
    area = _CONCEPT_AREA.get(low) or _PART_AREA.get(low)
    if area is None:
        c = find_concept(concept or "")
        area = _CONCEPT_AREA.get(c.lower()) or _PART_AREA.get(c.lower())
    return AREAS[area] if area else CONCEPTS


QUALIFIERS = ["Practical", "Effective", "Modern", "Pragmatic", "Applied", "Robust", "Everyday", "Advanced",
              "Essential", "Scalable", "Sustainable", "Defensive", "Idiomatic", "Reliable", "Principled"]

CHAPTER_PATTERNS = [
    "{c}", "{q} {c}", "{c} in Practice", "Principles of {c}", "Understanding {c}", "{c} Fundamentals",
    "Getting {c} Right", "{c}: Patterns and Pitfalls", "Mastering {c}", "{c} for Working Engineers",
    "A Field Guide to {c}", "{c} at Scale", "{q} {c} in Practice",
]

ACTIONS = ["Choosing", "Designing", "Measuring", "Testing", "Debugging", "Automating", "Documenting",
           "Reviewing", "Structuring", "Scaling", "Securing", "Monitoring", "Refactoring", "Versioning",
           "Configuring", "Evaluating", "Migrating", "Simplifying", "Isolating", "Validating"]

OBJECTS = ["Boundaries", "Interfaces", "Failure Modes", "Trade-offs", "Invariants", "Dependencies",
           "Configuration", "Error Paths", "Edge Cases", "Data Flow", "Ownership", "State", "Contracts",
           "Naming Conventions", "Module Layout", "Test Doubles", "Timeouts", "Resource Limits", "Metrics",
           "Rollbacks", "Schemas", "Permissions", "Workflows", "Abstractions", "Tooling", "Baselines",
           "Checklists", "Defaults", "Guarantees", "Bottlenecks", "Queues", "Caches", "Logs", "Budgets",
           "Feedback Loops", "Release Notes", "Code Paths", "Data Models", "Entry Points", "Side Effects"]

SECTION_PATTERNS = [
    "{a} {o} for {c}", "{c} and {o}", "{o} in {c}", "{c} vs. {o}", "{a} {c} {o}", "Common {o} in {c}",
    "{c}: {a} {o}", "{q} {o} in {c}", "Why {o} Matter in {c}", "A Worked Example: {a} {o}",
    "{a} {o} Without Surprises", "{q} Approaches to {c} {o}", "{c} {o} Checklist", "Anti-Patterns in {c} {o}",
    "{a} {o} Step by Step", "Tools for {a} {o}", "When to Use {q} {o}", "{c}: {o} and {o2}",
    "Case Study: {a} {o} in {c}", "{o}, {o2} and {c}",
]

COMMON_SECTIONS = [
    "Introduction", "Overview", "Key Concepts", "Best Practices", "Common Pitfalls", "Summary",
    "Key Takeaways", "Further Reading", "Real-World Examples", "Case Study", "Getting Started",
    "Core Principles", "Trade-offs", "Testing Strategies", "Performance Considerations",
    "Security Considerations", "Tooling and Automation", "Anti-Patterns", "Putting It All Together",
    "Frequently Asked Questions", "Exercises", "Checklist", "Historical Context", "Measuring Success",
    "Debugging Techniques", "Error Handling", "Documentation", "Team Practices", "Future Directions",
    "Conclusion", "Lessons Learned", "Design Considerations", "Implementation Details", "Worked Example",
    "Monitoring and Alerting", "Scaling Up", "Migration Strategies", "Code Review Checklist",
    "Common Mistakes", "When Not to Use It", "Practical Tips", "Glossary", "Quick Reference",
    "Choosing the Right Tool", "Configuration", "Maintenance", "Edge Cases", "Naming Conventions",
    "Versioning", "Observability",
]

BENEFITS = ["fewer surprises in production", "faster feedback", "code that is easier to change",
            "clearer ownership", "predictable releases", "simpler debugging", "lower operating cost",
            "safer refactoring", "shorter review cycles", "better onboarding for new team members",
            "fewer regressions", "a smaller blast radius when things go wrong", "measurable progress",
            "consistent behaviour across environments", "more honest estimates"]
RISKS = ["hidden coupling", "silent data loss", "flaky behaviour under load", "configuration drift",
         "unbounded queues", "leaky abstractions", "slow builds", "untested error paths",
         "accidental complexity", "stale documentation", "cascading failures", "premature optimization",
         "security holes in rarely used code", "knowledge that lives in one person's head",
         "brittle tests that fail for the wrong reasons"]
PRACTICES = ["writing the test first", "keeping functions small", "measuring before optimizing",
             "reviewing every change", "automating the boring parts", "failing fast and loudly",
             "making the default path the safe path", "recording decisions as they are made",
             "keeping interfaces narrow", "treating configuration as code", "logging with structure",
             "setting explicit timeouts", "deleting dead code", "pinning dependencies",
             "naming things after what they do"]
TEAMS = ["a small startup team", "a platform team", "an open source project", "a regulated enterprise",
         "a team of new graduates", "a distributed team across time zones", "an on-call rotation",
         "a product team under deadline pressure", "a team inheriting a legacy system"]

SENTENCES = [
    "{S} matters because it turns vague intentions into decisions that the whole team can see and review.",
    "At its core, {c} is about managing change: "
    "the code you write today will be read many more times than it is written.",
    "Teams that invest in {s} early usually report {b}.",
    "The most common failure mode is {r}, which tends to appear only after the system has grown.",
    "A useful rule of thumb is to start with {p} and relax it only when you can measure the cost.",
    "Consider how {t} would approach {s}: the constraints differ, but the underlying trade-offs are the same.",
    "In practice, {c} interacts closely with {c2}, so decisions in one area ripple into the other.",
    "Before adopting a new tool, ask what problem it solves and how you will know that it worked.",
    "Good {o} make the intended use obvious and the wrong use awkward.",
    "When {s} is neglected, the symptoms show up as {r} long before anyone names the cause.",
    "The goal is not perfection but a system whose behaviour you can predict and explain.",
    "Start by writing down the assumptions you are making about {o}, then test each one.",
    "{p} is cheap to adopt and pays off quickly, especially for {t}.",
    "Many teams discover the value of {c2} only after an incident forces them to look closely at {s}.",
    "A small, well-named abstraction is worth more than a clever one that only its author understands.",
    "Measure the effect of every change to {s}; intuition about {o} is often wrong.",
    "Automation helps here, but only after the manual process is understood and written down.",
    "The trade-off is real: more structure brings {b}, at the price of some up-front effort.",
    "Think of {s} as a contract between the people who write the code and the people who run it.",
    "Resist the temptation to solve every problem at once; iterate in small, reversible steps.",
    "Experienced engineers treat {o} as first-class design elements rather than afterthoughts.",
    "If a change to {c} is hard to test, that is usually a sign that the design needs another look.",
    "Documentation should explain why a decision was made, not only what the code does.",
    "A checklist for {s} keeps the important questions from being skipped under pressure.",
    "Keep the feedback loop short: the sooner a mistake in {o} is visible, the cheaper it is to fix.",
    "The same principles apply whether you are working on a prototype or a system that serves millions of users.",
    "It is tempting to copy what large companies do, but their constraints are rarely yours.",
    "{S} becomes much easier once {c2} is in place.",
    "Write the simplest version that could work, then let real usage tell you where it falls short.",
    "Code review is a good place to catch {r} before it reaches users.",
    "Every dependency you add is a promise to keep it updated, patched and understood.",
    "Clear {o} reduce the amount of context a reader needs to hold in their head.",
    "When in doubt, prefer explicit behaviour over implicit magic.",
    "Teams often underestimate how much {r} costs until they add up the hours spent on it.",
    "A good test suite describes the behaviour of {s} in a way that survives refactoring.",
    "Look for places where {o} are duplicated; duplication is often where bugs hide.",
    "{A} {o} is a skill that improves with deliberate practice and honest retrospectives.",
    "Whatever approach you choose, make it consistent across the codebase.",
    "Small inconsistencies in {o} compound over time into real maintenance costs.",
    "The example below shows one way to apply these ideas without adding unnecessary machinery.",
    "The key insight is that {c} is a means to an end: {b}.",
    "Avoid designing for hypothetical requirements; design for the change you can already see coming.",
    "When {t} adopts {s}, the first win is usually {b}.",
    "Logging and metrics around {o} turn guesswork into evidence.",
    "A failing build should point directly at the cause, not leave engineers searching through pages of output.",
    "Tools can enforce the rules, but people have to agree on why the rules exist.",
    "There is rarely a single right answer, but there are many answers that are clearly wrong.",
    "Treat every incident involving {s} as a chance to improve the system rather than to assign blame.",
    "Over time, {p} becomes a habit rather than a rule that needs enforcing.",
    "Be wary of {r}; it is easy to introduce and expensive to remove.",
    "The best time to think about {o} is before the first line of code is written.",
    "Pairing on a tricky change to {s} spreads knowledge and catches mistakes early.",
    "Performance work on {c} should start with a profile, not with a guess.",
    "Security is part of {c} from the start, not a feature added at the end.",
    "Version your {o} so that consumers can upgrade on their own schedule.",
    "A well-chosen default removes a whole class of configuration mistakes.",
    "Reading other people's code is one of the fastest ways to learn what works in {c}.",
    "Keep an eye on {o}: they are often the first place where {r} becomes visible.",
    "The cost of {r} grows with every release that ships without addressing it.",
    "Good engineering judgement comes from knowing which rules can bend and which cannot.",
    "Make the intent of the code obvious so that the next reader does not have to reverse-engineer it.",
    "The patterns in this section apply equally to {c} and to {c2}.",
    "Questions about {s} are best answered with a small experiment rather than a long debate.",
    "If the team cannot explain how {o} work, nobody will be able to fix them at three in the morning.",
    "A short design note shared before implementation can save days of rework on {s}.",
    "Aim for {b}; everything else is a means to that end.",
    "The discipline of {p} keeps {c} manageable as the codebase grows.",
    "Every exception to the standard approach should be written down along with its reason.",
]

_SLOT_BANKS: dict[str, list[str]] = {}  # filled below, once the banks exist

LIST_INTROS = ["A few guidelines help when working on {s}:", "Keep the following points in mind:",
               "The main ideas can be summarized as follows:", "When reviewing {o}, check these points:",
               "Useful habits for {s} include:", "Watch out for these warning signs:"]
BULLET_LEADS = ["be explicit", "start small", "measure first", "automate checks", "document decisions",
                "name things well", "fail loudly", "keep it reversible", "limit scope", "test the edges",
                "review regularly", "own the defaults", "prefer composition", "watch the metrics",
                "plan for failure", "keep interfaces narrow"]
CODE_INTROS = ["Here is a small example that puts {s} into practice:", "The following snippet shows the idea:",
               "A minimal example makes this concrete:", "Consider the following code:",
               "The example below illustrates {c}:", "In code, the pattern looks like this:"]
CLOSERS = ["Applied consistently, these habits make {s} a strength rather than a source of surprises.",
           "With these ideas in place, the next step is to apply them to your own codebase.",
           "Start with one of these practices, measure the effect, and build from there.",
           "The result is {b}, which is what good engineering is ultimately about."]


_SLOT_BANKS.update({
    "o": [x.lower() for x in OBJECTS], "b": BENEFITS, "r": RISKS, "p": PRACTICES, "t": TEAMS,
    "a": [x.lower() for x in ACTIONS], "A": ACTIONS,
})


# --------------------------------------------------------------------------------------------------------------
# code snippets (Python ones always parse)


def _snake(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")
    s = re.sub(r"_+", "_", s)
    if not s or s[0].isdigit():
        s = "item_" + s
    return s[:32].rstrip("_")


def _camel(text: str) -> str:
    return "".join(w.capitalize() for w in _snake(text).split("_"))[:32] or "Item"


_PY_SNIPPETS = [
    '''from dataclasses import dataclass


@dataclass(frozen=True)
class {C}Config:
    name: str
    limit: int = {n}
    enabled: bool = True

    def validate(self) -> None:
        if self.limit <= 0:
            raise ValueError(f"limit must be positive, got {{self.limit}}")
''',
    '''def {f}(items: list[int], threshold: int = {n}) -> list[int]:
    """Return the items above the threshold, in their original order."""
    return [item for item in items if item > threshold]


assert {f}([1, {n2}, 3]) == [{n2}] if {n2} > {n} else True
''',
    '''import logging

logger = logging.getLogger(__name__)


def {f}(records: list[dict]) -> int:
    processed = 0
    for record in records:
        try:
            handle_record(record)
            processed += 1
        except KeyError as exc:
            logger.warning("skipping record %s: missing %s", record.get("id"), exc)
    return processed
''',
    '''class {C}Repository:
    def __init__(self) -> None:
        self._items: dict[str, dict] = {{}}

    def add(self, key: str, value: dict) -> None:
        if key in self._items:
            raise KeyError(f"duplicate key: {{key}}")
        self._items[key] = value

    def get(self, key: str) -> dict | None:
        return self._items.get(key)
''',
    '''import time


def {f}(operation, attempts: int = {a}, delay: float = 0.{n}):
    for attempt in range(1, attempts + 1):
        try:
            return operation()
        except ConnectionError:
            if attempt == attempts:
                raise
            time.sleep(delay * 2 ** (attempt - 1))
''',
    '''import pytest


@pytest.mark.parametrize("value, expected", [(0, False), ({n}, True), (-1, False)])
def test_{f}(value, expected):
    assert ({f}(value) > 0) is expected
''',
    '''from contextlib import contextmanager
import time


@contextmanager
def {f}(label: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        print(f"{{label}} took {{elapsed:.3f}} s")
''',
    '''from typing import Protocol


class {C}Store(Protocol):
    def load(self, key: str) -> bytes: ...

    def save(self, key: str, data: bytes) -> None: ...


def {f}(store: {C}Store, key: str) -> int:
    return len(store.load(key))
''',
    '''import functools


@functools.lru_cache(maxsize={n}00)
def {f}(key: str) -> str:
    """Expensive lookup, cached by key."""
    return key.strip().lower()
''',
    '''from enum import Enum


class {C}State(Enum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"


def {f}(state: {C}State) -> bool:
    return state is {C}State.DONE
''',
    '''import asyncio


async def {f}(urls: list[str], limit: int = {n}) -> list[int]:
    semaphore = asyncio.Semaphore(limit)

    async def fetch(url: str) -> int:
        async with semaphore:
            await asyncio.sleep(0.01)
            return len(url)

    return await asyncio.gather(*(fetch(u) for u in urls))
''',
    '''def {f}(text: str) -> dict[str, int]:
    counts: dict[str, int] = {{}}
    for word in text.split():
        counts[word] = counts.get(word, 0) + 1
    return counts


print({f}("to be or not to be"))
''',
]

_OTHER_SNIPPETS = [
    ("bash", '''#!/usr/bin/env bash
set -euo pipefail

echo "running {f} checks"
python -m pytest -q tests/
git diff --exit-code
'''),
    ("javascript", '''function {F}(items, limit = {n}) {{
  return items.filter((item) => item.score > limit).map((item) => item.name);
}}

module.exports = {{ {F} }};
'''),
    ("sql", '''SELECT id, name, created_at
FROM {f}
WHERE status = 'active'
ORDER BY created_at DESC
LIMIT {n};
'''),
    ("yaml", '''{f}:
  enabled: true
  retries: {a}
  timeout_seconds: {n}
  owners:
    - platform-team
'''),
    ("go", '''func {F}(values []int) int {{
	total := 0
	for _, v := range values {{
		total += v
	}}
	return total
}}
'''),
    ("typescript", '''interface {C}Options {{
  name: string;
  limit?: number;
}}

export function {F}(options: {C}Options): string {{
  return `${{options.name}}:${{options.limit ?? {n}}}`;
}}
'''),
]

PYTHON_SHARE = 0.75


def snippet(rng: random.Random, concept: str, subject: str) -> tuple[str, str]:
    base = _snake((concept if rng.random() < 0.8 else subject) or "example")
    parts = base.split("_")[:3]
    verb = rng.choice(["check", "load", "build", "process", "apply", "measure", "collect", "parse"])
    f = "_".join([verb] + parts)[:40].rstrip("_")
    C = _camel("_".join(parts))
    F = f.split("_")[0] + "".join(w.capitalize() for w in f.split("_")[1:])
    n = rng.randint(2, 9)
    fill = {"f": f, "C": C, "F": F, "n": n, "n2": rng.randint(2, 9), "a": rng.randint(2, 5)}
    if rng.random() < PYTHON_SHARE:
        return "python", rng.choice(_PY_SNIPPETS).format(**fill)
    lang, tpl = rng.choice(_OTHER_SNIPPETS)
    return lang, tpl.format(**fill)


# --------------------------------------------------------------------------------------------------------------
# calibration: the shape of a whole simulated book, without HTTP


def simulate_book(parts: int = 8, chapters: int = 12, sections: int = 16, words: int = 250,
                  max_tokens: int = 520, model: str = "sim-qwen3", json_schema: bool = True,
                  request: str = "Write me a complete software engineering handbook. Every topic, with examples.",
                  ) -> dict[str, Any]:
    """Plan and write a book the way the product asks for one, and measure the figures the reference reports.

    The prompts mirror the product's planning and section prompts; any wording gives similar figures, since
    only the request hash and the quoted names matter.
    """
    import ast

    def ask(content: str, n: int | None, want_title: bool = False, mt: int = 1024) -> Answer:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": content}], "max_tokens": mt}
        if n is not None and json_schema:
            props: dict[str, Any] = {"items": {"type": "array", "items": {"type": "string"},
                                               "minItems": n, "maxItems": n}}
            if want_title:
                props = {"title": {"type": "string"}, **props}
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "titles", "schema": {"type": "object",
                                                                                   "properties": props}}}
        return answer(model, body)

    def titles(a: Answer) -> tuple[str | None, list[str]]:
        if a.kind == "json":
            v = orjson.loads(a.text)
            return v.get("title"), list(v["items"])
        lines = a.text.splitlines()
        book = lines[0][len("Title: "):] if lines and lines[0].startswith("Title: ") else None
        return book, [ln.split(". ", 1)[1] for ln in lines if ". " in ln and ln.split(".")[0].isdigit()]

    book, part_titles = titles(ask(f'You are planning a long book for this request: "{request}"\n'
                                   f"Give the book a title, and divide it into exactly {parts} parts.",
                                   parts, True))
    section_titles: list[str] = []
    stats = {"tokens": 0, "words": 0, "truncated": 0, "code_blocks": 0, "python_blocks": 0,
             "python_syntax_errors": 0, "unterminated": 0, "sections": 0}
    for p in part_titles:
        _, chs = titles(ask(f'You are planning the book "{book}", written for this request: "{request}"\n'
                            f'List exactly {chapters} chapter titles for part "{p}".', chapters))
        for ch in chs:
            _, secs = titles(ask(f'You are planning the book "{book}", written for this request: "{request}"\n'
                                 f'In part "{p}", chapter "{ch}".\n'
                                 f'List exactly {sections} section titles for chapter "{ch}".', sections))
            section_titles += secs
            for sec in secs:
                a = ask(f'Book: "{book}"\nPart: "{p}"\nChapter: "{ch}"\n'
                        f'Write the section "{sec}" in about {words} words of Markdown.', None, mt=max_tokens)
                pieces = a.pieces[:max_tokens]
                body = "".join(pieces)
                stats["sections"] += 1
                stats["tokens"] += len(pieces)
                stats["words"] += len(body.split())
                stats["truncated"] += len(a.pieces) > max_tokens
                stripped = body.rstrip()
                if not stripped or stripped[-1] not in ".!?:)\"'`*":
                    stats["unterminated"] += 1
                blocks = body.split("```")
                stats["code_blocks"] += len(blocks) // 2
                for i in range(1, len(blocks), 2):
                    if blocks[i].startswith("python\n") and i + 1 < len(blocks):
                        stats["python_blocks"] += 1
                        try:
                            ast.parse(blocks[i][len("python\n"):])
                        except SyntaxError:
                            stats["python_syntax_errors"] += 1
    counts: dict[str, int] = {}
    for t in section_titles:
        counts[t] = counts.get(t, 0) + 1
    n = max(1, stats["sections"])
    return {
        "sections": stats["sections"],
        "tokens": stats["tokens"],
        "words": stats["words"],
        "tokens_per_word": stats["tokens"] / max(1, stats["words"]),
        "mean_words": stats["words"] / n,
        "truncated": stats["truncated"],
        "truncated_share": stats["truncated"] / n,
        "unterminated": stats["unterminated"],
        "duplicate_section_titles": sum(1 for c in counts.values() if c > 1),
        "code_blocks": stats["code_blocks"],
        "code_blocks_per_section": stats["code_blocks"] / n,
        "python_blocks": stats["python_blocks"],
        "python_syntax_errors": stats["python_syntax_errors"],
        "book_title": book,
        "parts": part_titles,
    }
