"""A section's stream is stopped where the model signs off to whoever asked, and what it wrote so far is the section
(book/signoff.SignOffWatch, SectionCheck.watcher, Settings.stop_at_sign_off), rather than read on to its token cap.

The server is tests/fake_openai.FakeServer in mode "signs-off": every section is prose, then "I hope this helps! Let
me know ...", then talk to its max_tokens. It records how many chunks of each such answer it wrote before the client
went away."""

from __future__ import annotations

import json

import pytest
from cli_run import handbook
from fake_openai import BOOK_ARGS, FakeServer, reply

from orchestrator.book.checks import LoopWatch
from orchestrator.book.signoff import SIGNED_OFF, SignOffWatch
from orchestrator.book.talk import talk_spans
from orchestrator.core.config import PRESETS, Settings, settings_from
from orchestrator.core.reply import STOPPED
from orchestrator.job.section_check import SectionCheck

PROSE = ("A river's basin is the land that drains into it. Rain that falls anywhere in the basin reaches the river in "
         "the end, through streams, soil or groundwater. That is why a river carries the history of its whole "
         "basin: the salt of its fields, the silt of its hills and the waste of its towns. The Danube rises in the "
         "Black Forest and reaches the Black Sea after crossing ten countries, more than any other river. Its delta "
         "is a maze of channels, reed beds and lakes.\n\n")
WORDS = len(PROSE.split())  # 71


def _feed(watch, text: str, size: int = 3) -> int | None:
    """Where (characters fed) the watch fired, or None."""
    for i in range(0, len(text), size):
        if watch(text[i:i + size]) is not None:
            return i + size
    return None



@pytest.mark.parametrize("talk", [
    "I hope this helps! Let me know if you have any questions. P.S. Would you like a recipe too?",
    "Hope this helps! Happy learning! Would you like a recipe too?",  # no "I": still to whoever asked
])
def test_the_watch_stops_at_a_sign_off_after_the_section_and_keeps_the_section(talk):
    watch = SignOffWatch(WORDS // 2)
    at = _feed(watch, PROSE + talk)
    assert at is not None and watch.signed_off
    head = (PROSE + talk)[:at]
    assert head.startswith(PROSE) and len(head) <= len(PROSE) + len(talk.split("!")[0]) + 4
    assert talk_spans(head).tail == len(PROSE)  # book.md leaves the sign-off out, as any talk


@pytest.mark.parametrize("text", [
    PROSE + PROSE,  # no talk
    "Rivers.\n\nI hope this helps! Let me know.",  # too few words before it
    PROSE + "```python\nprint('I hope this helps! Let me know.')\n```\n\n" + PROSE,  # code is content
    PROSE + "- Let me know the river's level before you set out.\n",  # a list item is content
    PROSE + "Here is a revised version of the text: rivers drain basins.",  # talk, but no sign-off
    PROSE + "The ferryman said: let me knowledge-check you first.",  # "know" was part of a longer word
    # a handbook's own sentences that open as a sign-off does, but name no writer (review of stop 43)
    PROSE + "Feel free to contact the lock keeper on channel 14 whenever the water is high, day or night.\n\n" + PROSE,
    PROSE + "If there is anything else on the bench, clear it first. Then open the gate.\n\n" + PROSE,
    PROSE + "1. Close the sluice.\nIf there is anything else in the channel, clear it first.\n2. Open the gate.\n",
    # a sign-off within a quotation its paragraph opened
    PROSE + 'The notice reads: "The release is out on all regions. Let me know if you see errors. Thank you." It '
            "names the change and who to tell.\n\n" + PROSE,
])
def test_the_watch_does_not_stop_where_there_is_no_sign_off_after_the_section(text):
    watch = SignOffWatch(WORDS // 2)
    assert _feed(watch, text) is None and not watch.signed_off
    assert _feed(SignOffWatch(WORDS // 2), text, size=1) is None  # one character a delta: a word never read half


def test_a_sentence_is_read_once_it_has_ended():
    watch = SignOffWatch(10)
    for piece in (PROSE, "Let", " me", " know", " if you need more", ".", "**"):
        assert watch(piece) is None  # "know" may still become "knowledge", "." the first of "..."
    assert watch("\n") == SIGNED_OFF


def test_a_weak_opener_before_the_sign_off_does_not_hide_it():
    """"I hope that you found ..." is talk too weak to stop at; the sign-off after it still stops the stream, and
    book.md leaves out both."""
    text = (PROSE + "I hope that you found this guide useful. Let me know if you have any questions. "
            "Would you like to hear about the weather?")
    watch = SignOffWatch(WORDS // 2)
    at = _feed(watch, text)
    end = text.index("any questions.") + len("any questions.")
    assert at is not None and end < at <= end + 3  # the delta with the space after it
    assert talk_spans(text[:at]).tail == len(PROSE)


def test_a_signed_off_answer_is_accepted_and_a_looping_one_is_not():
    check = SectionCheck("Rivers", sign_off_words=WORDS // 2)
    watch = check.watcher()
    assert watch is not None and not isinstance(watch, LoopWatch | SignOffWatch)  # both watches, on the first answer
    assert _feed(watch, PROSE + "I hope this helps! Let me know.") is not None
    assert check(reply(PROSE + "I hope this helps", STOPPED)) == {"repaired_from": None, "loop": None}
    # the next attempt has a fresh watch: stopped by its loop watch, it is refused as before
    check = SectionCheck("Rivers", sign_off_words=WORDS // 2)
    line = "The cache keeps every record near the server that asked for it.\n"
    watch = check.watcher()
    assert _feed(watch, PROSE + line * 10) is not None
    with pytest.raises(ValueError, match="caught while streaming"):
        check(reply(PROSE + line * 4, STOPPED))
    assert isinstance(check.watcher(), SignOffWatch)  # the loop re-ask: watched for a sign-off only
    # off: the loop watch alone, as before
    assert isinstance(SectionCheck("Rivers").watcher(), LoopWatch)


def test_the_published_preset_reads_every_section_to_its_end():
    assert Settings().stop_at_sign_off is True
    assert PRESETS["published-take"]["stop_at_sign_off"] is False
    assert settings_from(PRESETS["published-take"]).stop_at_sign_off is False


@pytest.mark.parametrize("stop", [True, False])
def test_a_section_that_signs_off_is_stopped_there_and_kept(tmp_path, stop):
    out = tmp_path / "book"
    flag = "--stop-at-sign-off" if stop else "--no-stop-at-sign-off"
    with FakeServer("signs-off", section_chunk_delay=0.01) as srv:
        proc = handbook("A handbook of rivers", *BOOK_ARGS, "--backend", srv.url, "--out", str(out), flag)
    assert proc.returncode == 0, proc.stderr
    stats = json.loads((out / "stats.json").read_text())
    sections = stats["sections"]
    assert sections == 6 and stats["failed_sections"] == 0 and stats["empty_sections"] == 0
    assert stats["request_errors"] == 0 and stats["requests"] == stats["planning_requests"] + sections
    assert len(srv.talk_streams) == sections
    book = (out / "book.md").read_text()
    if stop:
        assert stats["signed_off_answers"] == stats["stopped_answers"] == sections
        assert stats["truncated_sections"] == 0
        # each stream dropped at its sign-off, about half way to its 400-token cap
        assert all(written < 0.75 * total for written, total in srv.talk_streams), srv.talk_streams
        assert "I hope this helps" not in book and "Would you also like" not in book
        assert book.count("Point 8 of this section") == sections  # every section's own prose, whole
    else:
        assert stats["signed_off_answers"] == stats["stopped_answers"] == 0
        assert stats["truncated_sections"] == sections
        assert all(written == total for written, total in srv.talk_streams), srv.talk_streams


def test_handbook_write_takes_an_on_off_flag_given_off():
    """`handbook write DIR --no-stop-at-sign-off` (or --no-repairs, --no-affinity) changes the setting the plan was
    journaled with; an --x/--no-x flag left out changes nothing. (Before stop 43 a --no-x flag given to `write` was
    read as left out.)"""
    from orchestrator.cli import write
    from orchestrator.cli.common import OneLineParser

    parser = OneLineParser(prog="handbook write")
    write.add_arguments(parser)
    given = write._values(parser.parse_args(["d", "--no-stop-at-sign-off", "--no-repairs", "--affinity"]))
    assert given == {"stop_at_sign_off": False, "repairs": False, "affinity": True}
    assert write._values(parser.parse_args(["d"])) == {}
    assert write._values(parser.parse_args(["d", "--typeset-after-writing"])) == {"typeset_while_writing": False}


def test_a_plan_journaled_before_the_setting_is_written_as_it_was_then(monkeypatch, tmp_path):
    """A plan folder of an earlier version holds no stop_at_sign_off: `handbook write` reads every section to its end,
    as that version did (and as a published-preset plan must), unless the flag is given."""
    from orchestrator.job import stepwise

    monkeypatch.setattr(stepwise, "peek_job", lambda _path: ("A book", {"parts": 1, "repairs": False}, None))
    assert stepwise.write_settings(tmp_path)[1].stop_at_sign_off is False
    given = stepwise.write_settings(tmp_path, Settings(stop_at_sign_off=True), frozenset({"stop_at_sign_off"}))[1]
    assert given.stop_at_sign_off is True
    monkeypatch.setattr(stepwise, "peek_job", lambda _path: ("A book", {"stop_at_sign_off": True}, None))
    assert stepwise.write_settings(tmp_path)[1].stop_at_sign_off is True
