"""Every environment override gradwire reads, in one place.

| variable | default | what |
|---|---|---|
| GRADWIRE_HOME | ~/.cache/gradwire | calibrations and other saved state |
| GRADWIRE_STATE_DIR | /run/gradwire | live emulated clusters (one JSON file each) |
"""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("GRADWIRE_HOME", "~/.cache/gradwire")).expanduser()


def state_dir() -> Path:
    return Path(os.environ.get("GRADWIRE_STATE_DIR", "/run/gradwire"))
