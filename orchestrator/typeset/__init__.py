"""Typesetting: book Markdown -> HTML -> an A5 PDF with WeasyPrint, laid out in parallel worker processes."""

from .book import TypesetInfo, template_dir, typeset, typeset_to

__all__ = ["TypesetInfo", "template_dir", "typeset", "typeset_to"]
