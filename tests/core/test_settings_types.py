"""Every setting is checked against its declared type and range, by every path into Settings (issue 24, item 2).

The paths: ``Settings(...)`` by a library user, ``settings_from(mapping)`` (what the CLI builds from presets, the
job file, the environment and flags), ``dataclasses.replace`` and a TOML ``--config`` file through the real CLI.
A wrong type or an unknown key is one ConfigError line naming the key, the value and what was expected; nothing is
coerced ("false" is not False, 1 is not True, 2.5 is not a whole number).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path

import pytest
from cli_run import handbook, one_line_error

from orchestrator.core.config import Backend, Settings, settings_from
from orchestrator.core.errors import ConfigError

UNREACHABLE = "http://127.0.0.1:9/v1"  # never contacted when the settings are refused first


def refused(call, *args, **kwargs) -> str:
    """``call`` raises a ConfigError; its one-line message."""
    with pytest.raises(ConfigError) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message and message.strip() == message, message
    return message


# -- settings_from: each kind ------------------------------------------------------------------------------------

WRONG = [
    # (key, value, a word the message must use for what was expected)
    ("pipeline", "false", "bool"),
    ("pipeline", "true", "bool"),
    ("pipeline", 1, "bool"),
    ("pipeline", 0, "bool"),
    ("forecast", "yes", "bool"),
    ("typeset_while_writing", 0.0, "bool"),
    ("stream_sections", True, "str"),
    ("context", 3, "str"),
    ("distinct_titles", "no", "bool"),
    ("repairs", 1, "bool"),
    ("affinity", "off", "bool"),
    ("stop_at_sign_off", "yes", "bool"),
    ("parts", 2.5, "int"),
    ("parts", 3.0, "int"),
    ("parts", "8", "int"),
    ("parts", True, "int"),
    ("attempts", [3], "int"),
    ("pages", "100", "int"),
    ("temperature", "0.5", "float"),
    ("temperature", True, "float"),
    ("chunk_timeout_s", "60", "float"),
    ("request_timeout_s", "600", "float"),
    ("minutes", [1.0], "float"),
    ("model", 5, "str"),
    ("system", 3, "str"),
    ("profile", True, "str"),
    ("templates", ["a", "b"], "str"),
    ("ladder", 1.5, "str"),
    ("formats", ["md", 1], "list"),
    ("formats", 5, "list"),
    ("formats", {"md": True}, "list"),
]


@pytest.mark.parametrize(("key", "value", "kind"), WRONG, ids=[f"{k}={v!r}" for k, v, _ in WRONG])
def test_settings_from_refuses_a_wrong_type(key, value, kind):
    message = refused(settings_from, {key: value})
    assert f"'{key}'" in message
    assert repr(value) in message  # the value as given, so the reader sees what was wrong
    assert kind in message
    assert "expected" in message


@pytest.mark.parametrize(("key", "value", "kind"), WRONG[:6], ids=[f"{k}={v!r}" for k, v, _ in WRONG[:6]])
def test_a_wrong_type_is_refused_over_a_base_too(key, value, kind):
    base = Settings(parts=2, chapters=2, sections=2)
    assert f"'{key}'" in refused(settings_from, {key: value}, base)


def test_the_example_of_the_issue():
    message = refused(settings_from, {"pipeline": "false"})
    assert message == "setting 'pipeline': expected true or false (a bool), got 'false' (a str)"


def _accepts(name: str, kind: type) -> bool:
    """The annotation of Settings.<name> takes values of ``kind`` (int is taken wherever float is)."""
    found: set[type] = set()

    def walk(tp: typing.Any) -> None:
        origin = typing.get_origin(tp)
        if origin is None:
            found.add(tp)
        elif origin in (tuple, list):
            found.add(list)
        else:
            for a in typing.get_args(tp):
                walk(a)

    walk(typing.get_type_hints(Settings)[name])
    return kind in found or (kind is int and float in found)


FIELDS = [f.name for f in dataclasses.fields(Settings)]


@pytest.mark.parametrize("name", FIELDS)
def test_every_field_refuses_every_other_kind(name):
    """Driven by the fields, so a field added later is covered: each refuses what its annotation does not take."""
    candidates: list[tuple[type, typing.Any]] = [
        (bool, True), (bool, False), (int, 7), (float, 2.5), (str, "false"), (str, "1"), (list, ["md"]),
    ]
    tried = 0
    for kind, value in candidates:
        if _accepts(name, kind):
            continue
        tried += 1
        message = refused(settings_from, {name: value})
        assert f"'{name}'" in message and "expected" in message, message
    assert tried >= 3, name  # every field refuses at least three of these kinds
    message = refused(Settings, **{name: object()})
    assert f"'{name}'" in message


# -- unknown keys ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["pipline", "temprature", "no_such_setting", "Parts"])
def test_unknown_key_is_refused_naming_it(key):
    message = refused(settings_from, {key: 1})
    assert f"'{key}'" in message


def test_unknown_key_suggests_the_near_one():
    assert "did you mean 'pipeline'" in refused(settings_from, {"pipline": False})


def test_the_job_files_own_keys_are_left_to_the_caller():
    """prompt, backends, out, format and preset are a job's, not settings: settings_from takes and ignores them
    (the CLI passes the merged job), and they change no setting."""
    s = settings_from({"prompt": "A book", "backends": [UNREACHABLE], "out": "x", "preset": "published-take",
                       "format": "html", "parts": 2})
    assert s == dataclasses.replace(Settings(), parts=2)


# -- Settings(...) and replace, directly -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"pipeline": "false"}, "pipeline"),
        ({"pipeline": 0}, "pipeline"),
        ({"finish_truncated": "no"}, "finish_truncated"),
        ({"words": 250.0}, "words"),
        ({"words": False}, "words"),
        ({"connect_timeout_s": "10"}, "connect_timeout_s"),
        ({"model": 1}, "model"),
        ({"formats": "md"}, "formats"),
        ({"formats": ("md", None)}, "formats"),
    ],
)
def test_direct_construction_refuses_a_wrong_type(kwargs, key):
    message = refused(Settings, **kwargs)
    assert f"'{key}'" in message
    assert repr(kwargs[key]) in message
    assert f"'{key}'" in refused(dataclasses.replace, Settings(), **kwargs)


def test_a_wrongly_typed_secret_is_not_shown():
    message = refused(Settings, api_key=987654321)
    assert "'api_key'" in message and "987654321" not in message
    message = refused(Backend, UNREACHABLE, api_key=["sk-do-not-print-me"])
    assert "'api_key'" in message and "sk-do-not-print-me" not in message


def test_backend_fields_are_checked_too():
    assert "'model'" in refused(Backend, UNREACHABLE, model=5)
    assert "'cap'" in refused(Backend, UNREACHABLE, cap="4")
    assert "'cap'" in refused(Backend, UNREACHABLE, cap=True)
    message = refused(Backend, ["http://user:hunter2@127.0.0.1:9/v1"])
    assert "'url'" in message and "hunter2" not in message
    assert Backend(UNREACHABLE, cap=4, model="m").cap == 4


# -- ranges --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("parts", 0), ("attempts", 0), ("max_tokens", -5), ("pages", 0),
        ("connect_timeout_s", 0), ("first_token_timeout_s", 0.0), ("chunk_timeout_s", -1.0), ("request_timeout_s", 0),
        ("metrics_interval_s", 0), ("interrupt_grace_s", -0.5), ("all_down_timeout_s", math.inf),
        ("chunk_timeout_s", math.nan), ("temperature", -0.1), ("temperature", math.nan), ("top_p", 0),
        ("top_p", 1.5), ("repetition_penalty", 0), ("frequency_penalty", 3), ("minutes", 0),
        ("profile", "clever"), ("planning", "yaml"), ("formats", ["md", "docx"]), ("formats", []),
    ],
)
def test_out_of_range_is_refused_naming_the_key(key, value):
    message = refused(settings_from, {key: value})
    assert key in message


def test_zero_grace_and_zero_all_down_timeout_mean_something_and_pass():
    s = settings_from({"interrupt_grace_s": 0, "all_down_timeout_s": 0.0})
    assert s.interrupt_grace_s == 0 and s.all_down_timeout_s == 0


# -- valid values still pass -------------------------------------------------------------------------------------

# A valid value other than the default for every field (a field added to Settings must be added here).
VALID: dict[str, typing.Any] = {
    "parts": 3, "chapters": 4, "sections": 5, "words": 100, "max_tokens": 200, "temperature": 1,
    "cap": 16, "model": "some/model", "api_key": "sk-x", "plan_max_tokens": 2048, "attempts": 1,
    "pipeline": False, "formats": ["html", "pdf"], "templates": "/tmp/templates", "connect_timeout_s": 2,
    "first_token_timeout_s": 0.5, "chunk_timeout_s": 30, "request_timeout_s": 600.0, "metrics_interval_s": 0.25, "interrupt_grace_s": 0,
    "all_down_timeout_s": 1.5, "profile": "small", "top_p": 0.9, "repetition_penalty": 1.1,
    "frequency_penalty": -0.5, "system": "Be brief.", "planning": "list", "finish_truncated": True, "pages": 40,
    "minutes": 2, "ladder": "/tmp/ladder.json", "forecast": True, "timeline": True, "typeset_while_writing": False,
    "stream_sections": "never", "context": "outline", "distinct_titles": False,
    "repairs": True, "affinity": False, "stop_at_sign_off": False,
}


def test_the_valid_table_covers_every_field():
    assert set(VALID) == set(FIELDS)


@pytest.mark.parametrize("name", FIELDS)
def test_every_default_passes(name):
    default = getattr(Settings(), name)
    assert getattr(Settings(**{name: default}), name) == default
    assert getattr(settings_from({name: default}), name) == default
    if isinstance(default, tuple):  # as a TOML array or a JSON list comes
        assert getattr(settings_from({name: list(default)}), name) == default


@pytest.mark.parametrize("name", FIELDS)
def test_every_valid_value_passes(name):
    value = VALID[name]
    expected = tuple(value) if isinstance(value, list) else value
    if name == "formats":
        expected = ("md", *expected)  # book.md is always written
    assert getattr(settings_from({name: value}), name) == expected
    assert getattr(Settings(**{name: value}), name) == expected


def test_all_valid_values_together_and_the_result_is_hashable():
    s = settings_from(VALID)
    assert isinstance(s.formats, tuple) and s.formats == ("md", "html", "pdf")
    hash(s)
    assert settings_from(s.public()) == dataclasses.replace(s, api_key=None)  # what a journal holds comes back


def test_formats_as_one_comma_string_still_parses():
    assert settings_from({"formats": "md, html"}).formats == ("md", "html")


def test_none_still_means_not_given():
    assert settings_from({"pipeline": None, "parts": None}) == Settings()


# -- through the real CLI: one line, exit 2, no traceback ----------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "key", "shown"),
    [
        ('pipeline = "false"', "pipeline", "'false'"),
        ("parts = 2.5", "parts", "2.5"),
        ('temperature = "0"', "temperature", "'0'"),
        ("formats = [1, 2]", "formats", "[1, 2]"),
        ("prompt = 5", "prompt", "5"),
    ],
)
def test_toml_job_file_with_a_wrong_type_exits_2_in_one_line(tmp_path: Path, line, key, shown):
    job = tmp_path / "job.toml"
    body = "" if key == "prompt" else 'prompt = "A book"\n'
    job.write_text(f'{body}{line}\nbackends = ["{UNREACHABLE}"]\n')
    error = one_line_error(handbook("--config", str(job), timeout=60), 2)
    assert f"'{key}'" in error and shown in error and "expected" in error


def test_toml_backend_table_with_a_wrong_type_exits_2(tmp_path: Path):
    job = tmp_path / "job.toml"
    job.write_text(f'prompt = "A book"\nbackends = [{{url = "{UNREACHABLE}", model = 5}}]\n')
    error = one_line_error(handbook("--config", str(job), timeout=60), 2)
    assert "'model'" in error and "5" in error


def test_a_zero_timeout_flag_exits_2():
    error = one_line_error(handbook("A book", "--first-token-timeout", "0", "--backend", UNREACHABLE, timeout=60), 2)
    assert "first_token_timeout_s" in error


def test_paths_may_be_given_as_paths_and_are_kept_as_text(tmp_path: Path):
    s = Settings(templates=tmp_path, ladder=tmp_path / "ladder.json")  # type: ignore[arg-type]
    assert s.templates == str(tmp_path) and s.ladder == str(tmp_path / "ladder.json")


def test_stream_sections_chooses_by_who_reads_the_text():
    from orchestrator.core.config import Settings

    assert Settings().stream_sections == "always"  # a book streams: a stalled server is caught between chunks
    table = {(mode, deltas): Settings(stream_sections=mode).streams_sections(deltas)
             for mode in ("auto", "always", "never") for deltas in (False, True)}
    assert table == {("auto", False): False, ("auto", True): True, ("always", False): True, ("always", True): True,
                     ("never", False): False, ("never", True): False}
    with pytest.raises(ConfigError, match="stream_sections must be one of auto, always, never; got 'sometimes'"):
        Settings(stream_sections="sometimes")


def test_context_is_outline_or_none_and_the_published_preset_keeps_the_reference_requests():
    from orchestrator.core.config import PRESETS

    assert Settings().context == "outline" and Settings().distinct_titles is True and Settings().repairs is True
    assert PRESETS["published-take"]["repairs"] is False
    assert PRESETS["published-take"]["context"] == "none" and PRESETS["published-take"]["distinct_titles"] is False
    assert "context must be one of outline, none; got 'plan'" in refused(Settings, context="plan")
