"""codecheck: the fenced blocks of a section parse in their language; errors carry the section's line; re-ask note."""

from __future__ import annotations

import warnings

import pytest

from orchestrator.book.codecheck import (
    BlockError,
    CodeReport,
    LanguageCounts,
    check_code,
    language_of,
    mark_broken,
    repair_note,
)
from orchestrator.book.fences import FencedBlock, close_open_fence, fenced_blocks, fenced_code


def _section(*blocks: tuple[str, str], lead: str = "# Title\n\nSome prose first.\n") -> str:
    """A section: the lead, then each (info, code) block in a closed fence with a prose line after it."""
    out = lead
    for info, code in blocks:
        out += f"\n```{info}\n{code}\n```\nProse after it.\n"
    return out


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.split("\n"), 1) if needle in line)


def test_fenced_blocks_give_info_code_and_lines_and_agree_with_fenced_code():
    text = 'Here:\n```json  \n{"items": ["A"]}\n```\n  ~~~~ py title=x\n  B\n~~~~\n``\n```\n[1,\n'
    assert fenced_blocks(text) == [
        FencedBlock("json", '{"items": ["A"]}', line=2, end=4, closed=True, indent=0),
        FencedBlock("py title=x", "  B", line=5, end=7, closed=True, indent=2),
        FencedBlock("", "[1,\n", line=9, end=11, closed=False, indent=0),
    ]
    for sample in (text, "", "no fences", "```", "```\n```", "a\r\n```py\r\nx\r\n```\r\n", "~~~\n```\n~~~"):
        assert [b.code for b in fenced_blocks(sample)] == fenced_code(sample)
    assert fenced_blocks("```\n```") == [FencedBlock("", "", 1, 2, True, 0)]
    assert fenced_blocks("x\n```") == [FencedBlock("", "", 2, 2, False, 0)]


VALID = {
    "python": "def f(x):\n    return {k: v for k, v in x.items()}\n\nprint(f({'a': 1}))",
    "py": "import asyncio\n\nasync def main():\n    await asyncio.sleep(0)",
    "python3": "x: int = 1\nmatch x:\n    case 1:\n        pass",
    "json": '{\n  "name": "demo",\n  "items": [1, 2.5, null, true]\n}',
    "toml": '[tool.demo]\nname = "demo"\nitems = [1, 2]\n\n[[tool.demo.rows]]\nx = 1',
    "yaml": "name: demo\nitems:\n  - 1\n  - {a: b}\n---\nsecond: document",
    # syntax only: an application's tags and a template's braces parse (constructing them would fail)
    "yml": "Resources:\n  Bucket:\n    Type: AWS::S3::Bucket\n    Name: !Ref BucketName\nimage: {{ image }}",
}

# (info, code, the line of the code holding the error, 1-based)
BROKEN = [
    ("python", "x = 1\ndef f(:\n    pass", 2),
    ("py", "def f():\nreturn 1", 2),  # IndentationError
    ("python3", "y = [\n    1,\n    2\nz = 3", 1),  # '[' was never closed: on the opening line
    ("json", '{\n  "a": 1,\n  "b": ,\n  "c": 3\n}', 3),
    ("json", '{\n  "a": 1, // a comment\n}', 2),
    ("toml", "[a]\nx = 1\ny = \n", 3),
    ("toml", "[a]\nx = 1\n[a]\n", 3),  # declared twice
    ("yaml", "a: 1\nb: [1, 2\nc: 3", 3),  # the flow sequence is never closed: found where the mapping goes on
    ("yml", "a: 1\n  b: 2", 2),  # a mapping value indented under a scalar
]


@pytest.mark.parametrize("info", sorted(VALID))
def test_valid_blocks_of_each_language_pass(info):
    report = check_code(_section((info, VALID[info])))
    lang = language_of(info)
    assert report.languages == {lang: LanguageCounts(seen=1, checked=1, broken=0, cut=0)}
    assert report.errors == () and report.ok


@pytest.mark.parametrize("info, code, bad", BROKEN)
def test_a_broken_block_is_caught_on_its_line_within_the_section(info, code, bad):
    text = _section(("python", VALID["python"]), (info, code), lead="# T\n\nLead.\n\nMore lead.\n")
    report = check_code(text)
    lang = language_of(info)
    assert report.broken == 1 and not report.ok
    (error,) = report.errors
    blocks = fenced_blocks(text)
    assert error.language == lang and error.block_line == blocks[1].line
    assert error.line == blocks[1].line + bad  # the block's first code line is the line after its fence
    assert text.split("\n")[error.line - 1] == code.split("\n")[bad - 1]
    assert "\n" not in error.message and error.message.split(":")[0].endswith("Error")


def test_error_messages_name_the_exception_and_the_parsers_words():
    report = check_code(_section(("python", "def f(:\n    pass"), ("json", "[1,]"), ("toml", "x = "),
                                 ("yaml", "a: [1")))
    assert [e.message for e in report.errors] == [
        "SyntaxError: invalid syntax", "JSONDecodeError: Expecting value", "TOMLDecodeError: Invalid value",
        "ParserError: while parsing a flow sequence expected ',' or ']', but got '<stream end>'"]
    indent = check_code(_section(("python", "def f():\nreturn 1"))).errors[0]
    assert indent.message.startswith("IndentationError: expected an indented block")


def test_a_toml_error_at_the_end_of_the_document_is_on_the_blocks_last_line():
    text = _section(("toml", 'a = 1\nb = "unterminated'))
    (error,) = check_code(text).errors
    assert error.line == _line_of(text, "unterminated")


@pytest.mark.parametrize("code", [
    "{{- if .Values.enabled }}\nkind: Service\n{{- end }}",  # Helm
    "{% for host in hosts %}\n- name: {{ host }}\n{% endfor %}",  # Jinja
    "apiVersion: v1\n{{ include \"labels\" . }}\nkind: Pod",  # a directive alone on its line
])
def test_a_yaml_template_is_seen_not_checked(code):
    report = check_code(_section(("yaml", code)))
    assert report.languages == {"yaml": LanguageCounts(seen=1, checked=0, broken=0, cut=0)} and report.ok


@pytest.mark.parametrize("info", ["", "bash", "console", "rust", "jsonc", "mermaid"])
def test_untagged_and_unknown_blocks_are_seen_not_checked(info):
    report = check_code(_section((info, "this is : not [ code in any language {")))
    assert report.seen == 1 and report.checked == 0 and report.broken == 0 and report.ok
    assert list(report.languages) == [language_of(info)]


@pytest.mark.parametrize("info, lang", [
    ("python", "python"), ("Python", "python"), ("PY", "python"), ("python3", "python"), ("py3", "python"),
    ("python title=example.py", "python"), ("{.python .numberLines}", "python"), ("{python}", "python"),
    ("{.Python}", "python"), ("JSON", "json"), ("toml", "toml"), ("yml", "yaml"), ("YAML", "yaml"),
    ("", "none"), ("   ", "none"), ("bash", "bash"), ("{r, echo=FALSE}", "r"), ("c++", "c++"),
])
def test_language_tags_are_normalised(info, lang):
    assert language_of(info) == lang


def test_counts_are_per_language_in_order_of_first_appearance():
    text = _section(("bash", "ls"), ("py", "x = 1"), ("python", "y = ("), ("json", "{}"), ("", "plain"),
                    ("yaml", "a: 1"), ("python3", "z = 2"))
    report = check_code(text)
    assert list(report.languages) == ["bash", "python", "json", "none", "yaml"]
    assert report.languages["python"] == LanguageCounts(seen=3, checked=3, broken=1, cut=0)
    assert report.languages["json"] == LanguageCounts(seen=1, checked=1, broken=0, cut=0)
    assert report.languages["yaml"] == LanguageCounts(seen=1, checked=1, broken=0, cut=0)
    assert report.languages["none"] == LanguageCounts(seen=1)
    assert (report.seen, report.checked, report.broken, report.cut) == (7, 5, 1, 0)
    assert report.seen == len(fenced_code(text))


def test_a_cut_final_block_is_counted_cut_not_broken():
    text = _section(("python", "x = 1")) + "\n```python\ndef f(x):\n    return sum(x for x in range(\n"
    report = check_code(text)
    assert report.languages["python"] == LanguageCounts(seen=2, checked=1, broken=0, cut=1)
    assert report.errors == () and report.ok and report.cut == 1
    for info in ("json", "", "bash"):  # cut whatever the language
        cut = check_code("Prose.\n\n~~~" + info + "\n{\"a\": [1,")
        assert cut.cut == 1 and cut.checked == 0 and cut.broken == 0


def test_a_closed_block_missing_its_end_is_broken_not_cut():
    report = check_code(_section(("python", "def f(x):\n    return sum(x for x in range(")))
    assert report.cut == 0 and report.broken == 1


def test_a_repl_transcript_is_parsed_without_its_prompts_and_output():
    repl = ">>> x = [1, 2]\n>>> for i in x:\n...     print(i)\n...\n1\n2\n>>> x\n[1, 2]\n>>>"
    assert check_code(_section(("python", repl))).ok
    output_only_breaks = ">>> import sys\nTraceback (most recent call last):\n  File \"<stdin>\", line 1\n>>> 1 +"
    text = _section(("pycon-not", "x"), ("python", output_only_breaks))
    (error,) = check_code(text).errors
    assert error.line == _line_of(text, ">>> 1 +")  # the error is mapped back to the prompt's line


@pytest.mark.parametrize("code", [
    "$ pip install requests\n$ python app.py",  # a shell session tagged python
    "for each item in the list:\n    process the item",  # pseudo-code
    "pip install requests",
])
def test_a_shell_session_or_pseudo_code_tagged_python_is_broken(code):
    report = check_code(_section(("python", code)))
    assert report.broken == 1 and report.errors[0].language == "python"


def test_python_warnings_are_no_errors_and_syntax_only_is_checked():
    code = 'path = "C:\\dir\\file"\nreturn 1\nawait something()'  # invalid escape: a SyntaxWarning only
    with_warnings = _section(("python", code))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_code(with_warnings).ok


def test_a_block_in_a_list_item_loses_its_fences_indentation():
    text = "Steps:\n\n1. Write:\n\n   ```python\n   def f():\n       return 1\n   ```\n\n2. Config:\n\n" \
           '   ```json\n   {"a":\n     1}\n   ```\n'
    report = check_code(text)
    assert report.checked == 2 and report.ok
    broken = check_code("1. Write:\n\n   ```toml\n   [a]\n   x = \n   ```\n")
    assert broken.errors[0].line == 5


def test_crlf_text_parses_and_keeps_its_lines():
    text = _section(("toml", "[a]\nx = 1"), ("json", '{"a":\n}')).replace("\n", "\r\n")
    report = check_code(text)
    assert report.checked == 2 and report.broken == 1
    assert report.errors[0].line == _line_of(text, "}") and report.errors[0].language == "json"


def test_tilde_and_longer_fences_and_empty_blocks():
    text = "~~~python\nx = '```'\ns = \"\"\"\n```\n\"\"\"\n~~~\n\n````json\n```\n````\n\n```python\n```\n"
    report = check_code(text)
    assert report.languages["python"] == LanguageCounts(seen=2, checked=2, broken=0, cut=0)
    assert report.languages["json"].broken == 1  # a stray fence inside a longer one is its code
    assert check_code("no code at all") == CodeReport({}, ())


def test_check_code_is_pure_and_its_json_is_complete():
    text = _section(("python", "x = ("), ("json", "{}"), ("bash", "ls"))
    first, second = check_code(text), check_code(text)
    assert first == second
    j = first.to_json()
    assert j["languages"]["python"] == {"seen": 1, "checked": 1, "broken": 1, "cut": 0}
    assert j["errors"] == [{"language": "python", "line": first.errors[0].line,
                            "message": first.errors[0].message, "block_line": first.errors[0].block_line}]


# ---------------------------------------------------------------------------------------------------------------
# repair_note


def test_repair_note_names_the_block_and_the_line():
    text = "# T\n\nProse.\n\nMore prose.\n\nStill prose.\n\nAnd more.\n\nLast.\n```python\nx = 1\ny = (\n```\n"
    errors = check_code(text).errors
    assert repair_note(errors) == (
        "The Python block starting on line 12 does not parse: line 14: SyntaxError: '(' was never closed."
        " Rewrite the section so that every Python block is valid Python.")


def test_repair_note_is_empty_without_errors_and_independent_of_order():
    assert repair_note([]) == ""
    errors = [BlockError("json", 30, "JSONDecodeError: Expecting value", 29),
              BlockError("python", 14, "SyntaxError: invalid syntax", 12)]
    note = repair_note(errors)
    assert note == repair_note(list(reversed(errors)))
    assert note.index("line 12") < note.index("line 29")
    assert note.endswith("every Python and JSON block is valid in its language.")
    assert "\n" not in note and note.count("does not parse") == 2


def test_repair_note_spells_out_three_errors_and_counts_the_rest():
    errors = [BlockError("python", 10 * k + 1, "SyntaxError: invalid syntax", 10 * k) for k in range(1, 6)]
    note = repair_note(errors)
    assert note.count("does not parse:") == 3 and "2 more blocks do not parse either." in note
    assert "line 40" not in note
    one_more = repair_note(errors[:4])
    assert "1 more block does not parse either." in one_more


def test_repair_note_does_not_double_a_messages_own_stop():
    note = repair_note([BlockError("python", 3, "SyntaxError: invalid syntax. Perhaps you forgot a comma?", 2)])
    assert "comma? Rewrite" in note and "?." not in note


def _marked(text: str) -> str:
    """:func:`mark_broken` of a text printed as generated."""
    return mark_broken(text, check_code(text).errors, text)


def test_mark_broken_puts_a_note_under_each_block_that_does_not_parse_and_nothing_else():
    text = _section(("python", "x = 1\ndef f(:\n    pass"), ("json", '{"a": 1}'), ("yaml", "a: [1, 2"))
    marked = _marked(text)
    notes = [line for line in marked.split("\n") if line.startswith("> **Note:**")]
    assert len(notes) == 2 and "the Python above does not parse (line 2: SyntaxError" in notes[0]
    assert notes[1].startswith("> **Note:** the YAML above does not parse (line 1: ")
    # each note follows its block's closing fence, a blank line after it (the prose line would join the quote)
    lines = marked.split("\n")
    for i in (i for i, line in enumerate(lines) if line.startswith("> **Note:**")):
        assert lines[i - 1] == "```" and lines[i + 1] == "" and lines[i + 2] == "Prose after it."
    assert [line for line in lines if not line.startswith("> **Note:**") and line] == [
        line for line in text.split("\n") if line]
    assert len(check_code(marked).errors) == 2  # a note is prose: marking adds no block


def test_mark_broken_leaves_good_code_cut_code_and_unchecked_languages_alone():
    for text in (_section(("python", "x = 1"), ("toml", 'a = "b"')), _section(("bash", "if then fi"), ("", "{{")),
                 "Prose.\n\n```python\ndef f(:"):  # the last: a block never closed is cut, not broken
        assert _marked(text) is text


def test_mark_broken_keeps_a_note_inside_its_list_item_and_escapes_the_message():
    text = "1. Step one:\n   ```python\n   print('(' \n   ```\n2. Step two.\n3. Step three."
    marked = _marked(text)
    assert "   ```\n   > **Note:** the Python above does not parse (line 1: SyntaxError: '(' was never closed).\n2." in marked
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").render(_marked("```json\n{\"a\": 1,}\n```"))
    assert "<blockquote>" in html and "<li>" not in html
    item = MarkdownIt("commonmark").render(marked)
    assert item.index("<blockquote>") < item.index("</li>")  # the note is inside step one
    assert "<li>Step three.</li>" in item  # and the list stays tight (a blank line would make every item a <p>)
    # a parser's message is shown as written: "<block end>" and "alias_x" are neither HTML nor emphasis
    for code, words in (("a: 1\n- b", "expected &lt;block end&gt;"), ("key: *alias_x_y_", "alias 'alias_x_y_'")):
        shown = MarkdownIt("commonmark").render(_marked(f"```yaml\n{code}\n```"))
        assert words in shown and "<em>" not in shown, shown


def test_mark_broken_leaves_blocks_the_model_never_closed_or_the_cut_dropped_alone():
    both = _section(("python", "def f(:"), ("json", "{"))
    assert _marked(both).count("Note:") == 2
    # the model left the JSON block open (the cap stopped it); closed for printing, it is cut code, not broken code
    generated = both[: both.rindex("```")]
    printed = close_open_fence(generated)
    once = mark_broken(printed, check_code(generated).errors, generated)
    assert once.count("Note:") == 1 and "the Python above" in once
    # a cut that kept only the first block prints only its note
    first = both[: both.index("```json")]
    assert mark_broken(first, check_code(both).errors, both).count("Note:") == 1
    # the only block open as generated: no note at all
    alone = "Prose.\n\n```json\n{"
    assert mark_broken(close_open_fence(alone), check_code(alone).errors, alone) == close_open_fence(alone)
