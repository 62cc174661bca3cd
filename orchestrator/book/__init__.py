"""Sections -> the book: Markdown assembled in outline order (assemble), a truncated section cut back to its last
sentence (cutback), the one code-fence grammar (fences), loop and debris checks (checks), text scans (textscan) and
the defect report (defects)."""
