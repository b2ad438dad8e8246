"""Encode and decode time of each aggregation method: the part of compression the model cannot
hide behind communication (it runs on the hook's thread, before and after each bucket's
messages).

A codec table is JSON: ``numel`` (the gradient the times were measured on), ``source`` and, per
method, ``encode_s`` and ``decode_s`` with the ``params`` used. Times scale in proportion to the
elements compressed. Methods that gather payloads (the ``gathered`` path of
:mod:`gradwire.catalogue`) decode every rank's payload, so their decode is P times
the table's ``decode_s``, plus ``decode_fixed_s`` where a method has one: the majority vote
counts all ranks' bits in one pass whatever P is, so its cost is mostly fixed. Two optional
fields price the sparse aggregations' own local work where a table measured it:
``decode_rank_s``, paid once per rank (Top-k adds every rank's k entries into the sum before
``decode_s`` writes the dense average), and ``merge_s``, paid once per merge on a rank's path
(gTop-k's ⊤ of two k-entry lists, ⌈lg P⌉ of them on the butterfly and on the tree). Built-in
tables: ``v100`` (Table 2 of the compression-utility paper: one encode+decode number per
method) and ``h100`` (measured on an H100 by ``benchmarks/compress_speed.py``).
``gradwire calibrate`` measures a table on the ranks' own device
(:mod:`gradwire.bench.codec_probe`) and stores it in its calibration file, which
``--calibration`` reads. A method's times price it at any density or PowerSGD rank unchanged;
whatif and advise say where the one asked differs from its ``params``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gradwire import catalogue
from gradwire.catalogue.paths import GATHERED
from gradwire.check import MAX_SECONDS, is_int, is_real
from gradwire.errors import GradwireError, did_you_mean
from gradwire.jsonfile import parse_object, read_object


@dataclass(frozen=True)
class CodecTable:
    name: str
    numel: int
    methods: dict[str, dict]
    source: str

    def lacks(self, what: str) -> str:
        """Why ``what`` (a method, or a word for several) cannot be priced from this table."""
        has = ", ".join(self.methods) or "none"  # a table of no methods: not "(it has )"
        return (f"codec table {self.name!r} has no encode/decode time for {what} (it has "
                f"{has}): use another --codecs table or run gradwire calibrate")

    def seconds(self, method: str, numel: int, world_size: int) -> tuple[float, float]:
        """(encode, decode) seconds for one bucket of ``numel`` elements."""
        if method not in self.methods:
            raise GradwireError(self.lacks(repr(method)))
        m, scale = self.methods[method], numel / self.numel
        gathered = catalogue.get(method).path is GATHERED
        decode = (m.get("decode_fixed_s", 0.0) + m["decode_s"] * (world_size if gathered else 1)
                  + m.get("decode_rank_s", 0.0) * world_size
                  + m.get("merge_s", 0.0) * merges(world_size))
        return m["encode_s"] * scale, decode * scale

    def measured_apart(self, method: str, density: float, rank: int) -> dict | None:
        """``{"method", "measured_at", "priced_at"}``: the density or PowerSGD rank ``method``
        is asked at, where it differs from the one this table's ``params`` say its times were
        measured at (the times are used unchanged, not scaled). None where they match, or
        where the method takes neither or the table records neither."""
        m = catalogue.get(method)
        asked = {**({"density": density} if m.takes_density else {}),
                 **({"rank": rank} if "rank" in m.options else {})}
        recorded = self.methods.get(method, {}).get("params")
        if not isinstance(recorded, dict):
            return None
        apart = [k for k, v in asked.items()
                 if is_real(recorded.get(k)) and not math.isclose(recorded[k], v)]
        if not apart:
            return None
        return {"method": method, "measured_at": {k: recorded[k] for k in apart},
                "priced_at": {k: asked[k] for k in apart}}


def apart_line(apart: dict) -> str:
    """:meth:`CodecTable.measured_apart`'s record as the line whatif and advise print."""
    measured = ", ".join(f"{k} {v:g}" for k, v in apart["measured_at"].items())
    asked = apart["priced_at"]
    priced = (f"{next(iter(asked.values())):g}" if len(asked) == 1
              else ", ".join(f"{k} {v:g}" for k, v in asked.items()))
    return (f"{apart['method']}'s encode/decode times were measured at {measured}; priced here "
            f"at {priced} unchanged")


def merges(world_size: int) -> int:
    """The ⊤ merges on the busiest rank's path of a gTop-k aggregation over ``world_size``
    ranks: ⌈lg P⌉ (the butterfly's lg of the largest power of two ≤ P, plus the fold where P
    is not one; the tree's root, one per level)."""
    return (int(world_size) - 1).bit_length()  # numpy's integers have no bit_length


BUILTIN = ("v100", "h100")
OPTIONAL = ("decode_fixed_s", "decode_rank_s", "merge_s")  # seconds a table may leave out
FIELDS = ("params", "encode_s", "decode_s", *OPTIONAL)  # of each method's entry


def load(name_or_path: str) -> CodecTable:
    """The built-in table ``name_or_path`` or the table in that JSON file (a calibration file's
    ``codecs``); every defect is a one-line error naming the field."""
    where = f"codec table {name_or_path}"
    if name_or_path in BUILTIN:
        text = resources.files("gradwire.perf").joinpath("codecs", f"{name_or_path}.json")
        doc = parse_object(text.read_text(), where)
    elif Path(name_or_path).is_file():
        doc = read_object(name_or_path, where)
        if "codecs" in doc:  # a calibration file keeps its table under "codecs"
            doc = doc["codecs"]
            if not isinstance(doc, dict):
                raise GradwireError(f"{where}: field 'codecs' must be an object (a codec "
                                    f"table: numel, methods), got {doc!r}")
    else:
        raise GradwireError(f"unknown codec table {name_or_path!r}"
                            f"{did_you_mean(name_or_path, BUILTIN)}: expected "
                            f"{', '.join(BUILTIN)} or a JSON file")
    numel, methods = doc.get("numel"), doc.get("methods")
    if not is_int(numel, 1):
        raise GradwireError(f"{where}: field 'numel' must be an integer >= 1 (the elements the "
                            f"times were measured on), got {numel!r}")
    if not isinstance(methods, dict):
        raise GradwireError(f"{where}: field 'methods' must be an object of methods, got "
                            f"{methods!r}")
    return CodecTable(name_or_path, numel, dict(methods), check_table(doc, where))


def check_table(doc: dict, where: str, field: str = "") -> str:
    """A codec table's ``methods`` (:func:`check_methods`), ``dtype`` and ``source``, as a
    table file and a calibration's ``codecs`` both hold them (``field``: the table's place in
    its file); its source. The times are per fp32 element: a table measured on
    half-precision elements would price fp32 buckets at half the time."""
    check_methods(doc["methods"], where, field)
    dtype = doc.get("dtype", "float32")
    if dtype != "float32":
        raise GradwireError(f"{where}: field '{field}dtype' must be 'float32' (the model "
                            f"prices codecs per fp32 element), got {dtype!r}")
    source = doc.get("source", "")
    if not isinstance(source, str):
        raise GradwireError(f"{where}: field '{field}source' must be text, got {source!r}")
    return source


def check_methods(methods: dict, where: str, field: str = "") -> None:
    """Each method of a codec table's ``methods``: an object of ``encode_s``, ``decode_s`` and,
    optionally, ``decode_fixed_s``, ``decode_rank_s`` and ``merge_s``, seconds from 0 to
    :data:`gradwire.check.MAX_SECONDS`; else a
    one-line error naming ``where`` and the field (``field``: the table's place in its file,
    e.g. "codecs." in a calibration)."""
    def name(path: str) -> str:
        return f"field '{field}{path}'" if field else path

    for method, m in methods.items():
        if method not in catalogue.METHODS:  # a misspelt one would leave its method unpriced
            raise GradwireError(f"{where}: {name(f'methods.{method}')}: unknown method "
                                f"{method!r}{did_you_mean(method, catalogue.METHODS)}: "
                                f"expected one of {', '.join(catalogue.METHODS)}")
        if not isinstance(m, dict):
            raise GradwireError(f"{where}: {name(f'methods.{method}')} must be an object with "
                                f"encode_s and decode_s, got {m!r}")
        for key in m:  # a misspelt optional time ("merge_S") would be priced as 0
            if key not in FIELDS:
                raise GradwireError(f"{where}: {name(f'methods.{method}.{key}')}: unknown "
                                    f"field{did_you_mean(str(key), FIELDS)}: expected "
                                    f"{', '.join(FIELDS)}")
        for key in ("encode_s", "decode_s", *OPTIONAL):
            v = m.get(key, 0.0 if key in OPTIONAL else None)
            if not is_real(v, 0, MAX_SECONDS):  # as every time a file gives the model
                over = f" and <= {MAX_SECONDS:g}" if is_real(v, MAX_SECONDS, above=True) else ""
                raise GradwireError(f"{where}: {name(f'methods.{method}.{key}')} must be a "
                                    f"number of seconds >= 0{over}, got {v!r}")
