"""The files a user hands to gradwire (model profiles, codec tables, calibrations), read with
one-line errors that name the file and what is wrong with it, never a traceback; and the
output paths of every command, checked before the work starts (:func:`check_writable`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from gradwire.errors import GradwireError


def parse_object(text: str, where: str) -> dict:
    """The JSON object in ``text``; ``where`` names it in the error (a file, a built-in)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise GradwireError(f"{where}: line {e.lineno}, column {e.colno}: not valid JSON: "
                            f"{e.msg}") from None
    except RecursionError:
        raise GradwireError(f"{where}: not valid JSON here: nested too deep") from None
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


def check_writable(path: str | Path | None, option: str) -> Path | None:
    """``path`` as a Path once it is clear that a file can be written there (None stays None):
    commands check their output options before the work, so that an hour of training is not
    lost to a typo in ``--json``. Refused with a one-line error: a directory, a parent folder
    that does not exist or is not a folder, one this process may not write into, or a file it
    may not overwrite."""
    if path is None:
        return None
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    where = f"{option} {str(p)!r}"
    if p.is_dir():
        raise GradwireError(f"{where} is a directory: give a file name")
    if not parent.exists():
        raise GradwireError(f"{where}: folder {str(parent)!r} does not exist (create it first)")
    if not parent.is_dir():
        raise GradwireError(f"{where}: {str(parent)!r} is not a folder")
    if p.exists() and not os.access(p, os.W_OK):
        raise GradwireError(f"{where}: the file exists and may not be written")
    if not p.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise GradwireError(f"{where}: folder {str(parent)!r} may not be written")
    return p
