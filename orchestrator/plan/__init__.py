"""Planning: the outline, level by level, one request per node."""

from .planner import (
    Planner,
    TitleStream,
    book_title_from_prompt,
    extract_titles,
    norm,
    parse_titles,
    weak_title,
)

__all__ = ["Planner", "TitleStream", "book_title_from_prompt", "extract_titles", "norm", "parse_titles", "weak_title"]
