"""Typesetting: book Markdown -> HTML -> an A5 PDF with WeasyPrint, laid out in parallel worker processes."""

from .book import TypesetInfo, typeset, typeset_to

__all__ = ["TypesetInfo", "typeset", "typeset_to"]
