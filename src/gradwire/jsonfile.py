"""The files a user hands to gradwire (model profiles, codec tables, calibrations), read with
one-line errors that name the file and what is wrong with it, never a traceback; and the
output paths of every command, checked before the work starts (:func:`check_writable`) and
replaced whole (:func:`written_to`; figures: :func:`save_figure`)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import stat
import sys
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from gradwire.errors import GradwireError


def shown(text: str) -> str:
    """``text`` for a one-line message: as it is, but with control characters (a newline,
    a carriage return in a file name) written as escapes."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """One JSON object as a dict, refused where a key repeats (``json`` keeps the last
    silently: a profile that gives ``forward_s`` twice would be read as only one of them)."""
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return doc


def parse_object(text: str, where: str) -> dict:
    """The JSON object in ``text``; ``where`` names it in the error (a file, a built-in)."""
    where = shown(where)
    try:
        doc = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise GradwireError(f"{where}: line {e.lineno}, column {e.colno}: not valid JSON: "
                            f"{e.msg}") from None
    except _DuplicateKey as e:
        raise GradwireError(f"{where}: key {shown(e.key)!r} appears twice in one object: which "
                            "value is meant is not clear") from None
    except ValueError:  # an integer of more than 4300 digits, which int() refuses
        raise GradwireError(f"{where}: not valid JSON here: a number too long") from None
    except RecursionError:
        raise GradwireError(f"{where}: not valid JSON here: nested too deep") from None
    if not isinstance(doc, dict):
        raise GradwireError(f"{where}: expected a JSON object at the top, got "
                            f"{type(doc).__name__}")
    if "\\u" in text and _lone_surrogate(doc):
        # json reads "\ud800" as a str no UTF-8 writer takes: printing it or writing a result
        # that holds it failed with a UnicodeEncodeError traceback, after the work
        raise GradwireError(f"{where}: not valid JSON here: a \\u escape of half a character "
                            "(a lone surrogate, \\ud800 to \\udfff) in a string")
    return doc


def _lone_surrogate(doc: object) -> bool:
    """Whether a string of ``doc`` (a key or a value) holds a lone surrogate."""
    try:
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def read_text(path: str | Path, where: str) -> str:
    """The text of the file at ``path``, read as UTF-8 whatever the locale (JSON's encoding,
    and what gradwire writes; a leading byte-order mark, which some Windows editors write, is
    dropped as RFC 8259 allows; line ends as text files read them, "\\r\\n" and "\\r" as
    "\\n"). One-line errors for a file that cannot be read, a path that is not a regular file
    (a device such as /dev/zero would be read for ever, a pipe would wait for a writer), and a
    file that is not UTF-8: binary (a NUL byte in it), or text in another encoding, named by
    its first byte that is not UTF-8."""
    where = shown(where)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise GradwireError(f"{where}: not a regular file")
        data = Path(path).read_bytes()
    except OSError as e:
        raise GradwireError(f"{where}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        if b"\0" in data:
            raise GradwireError(f"{where}: not a text file") from None
        # Latin-1's "é" is the one byte 0xe9: text, but not the UTF-8 a JSON file is
        head = data[:e.start]
        line = 1 + head.count(b"\n") + head.count(b"\r") - head.count(b"\r\n")  # as read
        raise GradwireError(f"{where}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                            f"{e.start}, line {line}), as a JSON file must be: save it as "
                            "UTF-8") from None
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


def read_object(path: str | Path, where: str) -> dict:
    """The JSON object in the file at ``path`` (:func:`parse_object`)."""
    return parse_object(read_text(path, where), where)


# Kernel file systems: their files take only what the kernel expects, and root may appear to
# be allowed to write them (os.access says yes to root) until the write itself fails.
KERNEL_FS = (Path("/proc"), Path("/sys"))


def check_writable(path: str | Path | None, option: str) -> Path | None:
    """``path`` as a Path once it is clear that a file can be written there (None stays None):
    commands check their output options before the work, so that an hour of training is not
    lost to a typo in ``--json``. ``path`` is best given as typed (a str): a Path has already
    dropped a trailing "/". Refused with a one-line error: a directory, or a name typed as
    one (:func:`_check_file_name`: "out/", which Path reads as the file "out"); a parent folder
    that does not exist or is not a folder, or that this process may not write into (also
    for an existing file: the result is written beside it and renamed over it; for a link to
    no file, the folder of the file it names; a link to a file is written beside that file, or
    through the link, so only the file's own opening counts); a loop of links; a path in
    /proc or /sys; an existing file that is not a regular file (a device such as /dev/full, a
    pipe, a socket: whether a device takes the result shows only when it is written, so none
    is taken) or that cannot be opened for writing. A write can still fail
    later (a disk that fills during the run): the commands' writer then saves the result
    elsewhere and says where (:func:`gradwire.cli.options.write_text`)."""
    if path is None:
        return None
    p = Path(path)
    where = f"{option} {str(p)!r}"
    try:
        _check_file_name(os.fspath(path), p, option)
        return _check_writable(p, where)
    except OSError as e:  # a name too long, a loop of links: the checks' own calls failed
        raise GradwireError(f"{where}: {e.strerror or e}") from None


# What a file name typed as a folder's is refused with, "such as out/NAME": a name of the
# kind the option writes (a figure's extension names its format).
_EXAMPLE_NAMES = {"--plot": "figure.png", "--checkpoint": "checkpoint.pt",
                  "--timeline": "timeline.json"}


def _check_file_name(typed: str, p: Path, option: str) -> None:
    """Refuse ``typed`` where it names a folder by its spelling, a trailing separator ("out/")
    or a last "." ("out/."), that is not one here (a folder there is refused as a directory,
    by :func:`_check_writable`): Path drops both, and the result was written to a file "out"
    (a folder, given to hold it, meant none); an existing file "out" was replaced."""
    seps = tuple(s for s in (os.sep, os.altsep) if s)
    tail = next((s for s in seps if typed.endswith(s)), None)
    if tail is None and typed.endswith(tuple(s + "." for s in seps)):
        tail = typed[-2:]
    if tail is None or p.is_dir():
        return
    example = os.path.join(typed.removesuffix(tail).rstrip("".join(seps)) or typed[:1],
                           _EXAMPLE_NAMES.get(option, "result.json"))
    raise GradwireError(f"{option} {typed!r} names a folder (it ends in {tail}): give a "
                        f"file name, such as {shown(example)}")


def _check_writable(p: Path, where: str) -> Path:
    parent = p.parent if str(p.parent) else Path(".")
    real = Path(os.path.realpath(p))
    kernel = next((k for k in KERNEL_FS if real == k or k in real.parents), None)
    if kernel is not None:
        raise GradwireError(f"{where} is in {kernel}, a kernel file system: give a file "
                            "elsewhere")
    _check_not_a_directory(p, where)
    if p.is_symlink() and not p.exists():
        try:
            os.stat(p)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise GradwireError(f"{where} is a loop of links: no file can be written "
                                    "through it; give a file name") from None
        # a link to no file: the write makes the file it names, in that file's folder
        parent, where = real.parent, f"{where} (a link to {str(real)!r})"
    if not parent.exists():
        raise GradwireError(f"{where}: folder {str(parent)!r} does not exist (create it first)")
    if not parent.is_dir():
        raise GradwireError(f"{where}: {str(parent)!r} is not a folder")
    if p.exists():
        if not p.is_file():
            raise GradwireError(f"{where} is not a regular file (a device, a pipe or a "
                                "socket): give a file name")
        try:
            with open(p, "a"):  # appends nothing: the file is left as it was
                pass
        except OSError as e:
            raise GradwireError(f"{where}: the file exists and may not be written "
                                f"({e.strerror or e})") from None
        if p.is_symlink():  # written beside the file it names, or through the link in place
            return p        # (:func:`written_to`): the open above is the check
    if not os.access(parent, os.W_OK | os.X_OK):
        raise GradwireError(f"{where}: folder {str(parent)!r} may not be written")
    return p


def _check_not_a_directory(p: Path, where: str) -> None:
    if p.is_dir():
        raise GradwireError(f"{where} is a directory: give a file name")


def out_file(typed: str) -> Path:
    """A script's ``--out`` as a Path, for argparse (``type=out_file``): refused while the
    arguments are parsed, before any work, with argparse's usage and one ``error:`` line,
    where it names a folder: by its spelling (:func:`_check_file_name`: "out/", which Path
    reads as the file "out", written after the whole run) or as one that exists. Only the
    name is checked, not its folder: a script may create that (``mkdir(parents=True)``);
    :func:`check_writable` is the whole check. A default that is already a Path is not
    passed through it."""
    p = Path(typed)
    where = repr(str(p))  # argparse's line names the option: "argument --out: 'x' is ..."
    try:
        _check_file_name(typed, p, "--out")
        _check_not_a_directory(p, where)
    except OSError as e:  # a name too long: is_dir's own call failed
        raise argparse.ArgumentTypeError(f"{where}: {e.strerror or e}") from None
    except GradwireError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--out ")) from None
    return p


# The longest file name most file systems take (NAME_MAX: 255 bytes on ext4, xfs, btrfs, tmpfs).
NAME_MAX = 255


def _temporary_name(name: str) -> str:
    """``.NAME.PID.tmp``, with NAME cut short (and a checksum of the whole added) where the
    whole would be longer than :data:`NAME_MAX` bytes: a name that
    :func:`check_writable` allowed must not fail only at the end of the work for its
    temporary's sake."""
    suffix = f".{os.getpid()}.tmp"
    raw = os.fsencode(name)
    if 1 + len(raw) + len(suffix) <= NAME_MAX:
        return f".{name}{suffix}"
    room = NAME_MAX - 1 - len(suffix) - 9  # 9: "#" and 8 hex digits of the checksum
    # fsdecode keeps the bytes of a character cut in two as they are: still at most room
    return f".{os.fsdecode(raw[:room])}#{zlib.crc32(raw):08x}{suffix}"


@contextlib.contextmanager
def written_beside(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for the block to write; renamed over ``path`` when the
    block ends, so a file that was there stays whole until the new one is, and keeps its mode
    (a calibration kept 0600 stays 0600); removed when the block fails, so nothing half written
    passes for the result."""
    tmp = path.with_name(_temporary_name(path.name))
    try:
        yield tmp
        with contextlib.suppress(FileNotFoundError):  # no file there yet: the umask's mode
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        # On the disk before the name points at it: after a crash (power, kernel) the rename
        # may be there without the data, an empty file in place of the one that was whole.
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def written_to(path: Path) -> Iterator[Path]:
    """Where to write ``path`` so that it is replaced whole: beside it, then renamed over it
    (:func:`written_beside`). A link to a regular file stays a link: the file it points to is
    replaced whole, beside itself (written through the link, in place, only where that file's
    folder may not be written); a device node (/dev/stdout, /dev/full) or a link to anything
    else is written where it is."""
    if path.is_symlink():
        real = Path(os.path.realpath(path))
        if (real.is_file() and not real.is_symlink()
                and os.access(real.parent, os.W_OK | os.X_OK)):
            path = real
    if path.is_symlink() or (path.exists() and not path.is_file()):
        yield path
    else:
        with written_beside(path) as tmp:
            yield tmp


def replace_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` in UTF-8 (as :func:`read_text` reads it, whatever the
    locale), replaced whole (:func:`written_to`): a write that fails half way (a full disk, a
    signal) leaves the file that was there."""
    with written_to(Path(path)) as target, open(target, "w", encoding="utf-8") as f:
        f.write(text)


def save_figure(fig: object, path: str | Path, dpi: int) -> Path:
    """Write the matplotlib figure ``fig`` to ``path`` in the format its extension names,
    replaced whole (:func:`written_to`: a disk that fills mid-write leaves the figure that was
    there), and close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        with written_to(path) as target:
            # no extension: matplotlib's default format, not one read from the temporary's
            fig.savefig(target, dpi=dpi,  # type: ignore[attr-defined]
                        format=path.suffix[1:].lower() or plt.rcParams["savefig.format"])
    finally:
        plt.close(fig)  # type: ignore[arg-type]
    return path


def finite(doc: object) -> object:
    """``doc`` with every float that is not finite (a diverged loss, a time that is infinite
    where nothing fits) as None: JSON has no NaN or Infinity, and readers other than Python's
    (jq, JavaScript, most JSON libraries) refuse a file that holds them."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: finite(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [finite(v) for v in doc]
    return doc


def dumps(doc: object, **kwargs: object) -> str:
    """``doc`` as strict JSON (:func:`finite`): what every file gradwire writes holds."""
    return json.dumps(finite(doc), allow_nan=False, **kwargs)  # type: ignore[arg-type]


def save_elsewhere(path: Path, text: str) -> str:
    """Save ``text``, which could not go to ``path``, as a new file named after it in the
    current folder or else the temporary one; say where. Where neither takes it, print it on
    stdout (the run's result is never only lost)."""
    # within NAME_MAX: a long name, which check_writable allowed, failed in both folders
    suffix = path.suffix if len(os.fsencode(path.suffix)) <= 16 else ""
    room = NAME_MAX - len("gradwire--") - 8 - len(os.fsencode(suffix))  # 8: mkstemp's letters
    stem = path.stem
    while len(os.fsencode(stem)) > room:  # whole characters
        stem = stem[:-1]
    for folder in (Path.cwd(), Path(tempfile.gettempdir())):
        try:
            fd, name = tempfile.mkstemp(prefix=f"gradwire-{stem}-", suffix=suffix, dir=folder)
        except OSError:
            continue
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:  # as every file gradwire writes
                f.write(text)
            return f"result saved to {name}"
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(name)
    sys.stdout.write(text)
    sys.stdout.flush()
    return "nowhere else to save it either: the result is printed above, on stdout"
