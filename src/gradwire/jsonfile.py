"""The JSON files a user hands to gradwire (model profiles, codec tables, calibrations), read
with one-line errors that name the file and what is wrong with it, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

from gradwire.errors import GradwireError


def parse_object(text: str, where: str) -> dict:
    """The JSON object in ``text``; ``where`` names it in the error (a file, a built-in)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise GradwireError(f"{where}: line {e.lineno}, column {e.colno}: not valid JSON: "
                            f"{e.msg}") from None
    if not isinstance(doc, dict):
        raise GradwireError(f"{where}: expected a JSON object at the top, got "
                            f"{type(doc).__name__}")
    return doc


def read_text(path: str | Path, where: str) -> str:
    """The text of the file at ``path``; a file that cannot be read is a one-line error."""
    try:
        return Path(path).read_text()
    except OSError as e:
        raise GradwireError(f"{where}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise GradwireError(f"{where}: not a text file") from None


def read_object(path: str | Path, where: str) -> dict:
    """The JSON object in the file at ``path`` (:func:`parse_object`)."""
    return parse_object(read_text(path, where), where)
