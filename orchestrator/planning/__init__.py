"""Planning: the outline, level by level, one request per node.

titles.py parses a reply (pure), made.py makes the titles no reply gave (pure), title_stream.py reads a reply's titles
while it streams, stream.py follows a reply and starts children from it, planner.py asks for every node through the
Dispatcher.
"""

from .made import book_title_from_prompt
from .planner import Planner, SectionCallback
from .title_stream import TitleStream
from .titles import Titles, extract_titles, parse_titles, weak_title

__all__ = [
    "Planner",
    "SectionCallback",
    "TitleStream",
    "Titles",
    "book_title_from_prompt",
    "extract_titles",
    "parse_titles",
    "weak_title",
]
