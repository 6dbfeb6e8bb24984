"""What a benchmark hands back: its result as indented JSON on stdout, and the same text in
the file its ``--json`` (or ``--out``) names, for the docs to cite."""

from __future__ import annotations

import json
from pathlib import Path


def emit(result: object, path: str | Path | None) -> None:
    """``result`` printed as indented JSON, and written (newline-ended) to ``path`` when one
    is given."""
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        Path(path).write_text(text + "\n")
