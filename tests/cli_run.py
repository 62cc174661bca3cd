"""`handbook ...` run as a user would: a child process of this interpreter, with no API key and no backends from
the environment (a test names its own), its output captured."""

from __future__ import annotations

import os
import subprocess
import sys


def handbook(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "HANDBOOK_BACKENDS")}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True,
                          timeout=timeout, env=e, check=False)


def one_line_error(proc: subprocess.CompletedProcess, code: int) -> str:
    """The process exited with ``code`` and said why in exactly one 'handbook: error:' line, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("handbook: error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]
