"""A GGUF file's scalar metadata and where its tensor data begins, read in milliseconds.

gguf-py's GGUFReader builds a Python object for every element of every array, and a model's
tokenizer vocabulary is an array of 50 000-250 000 strings: it takes 3-4 s on the bundled
bench's model alone, and every profile, validate and tune probes its model. What the tuner
needs from the header (the architecture, the file type, the end of the metadata for content_id)
is scalars and one offset, so arrays are stepped over here, not parsed. The layout is GGUF's
(versions 2 and 3, either byte order), as gguf-py's reader reads it; the tests hold the two
readers to the same answer.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32  # GGUF's, unless general.alignment says otherwise

# GGUF value types (gguf.GGUFValueType): struct format of each fixed-size one.
_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The file is not GGUF, or its header is cut short or malformed."""


@dataclass(frozen=True)
class GGUFMeta:
    version: int
    fields: dict[str, object]  # scalar key-values (strings decoded); arrays are left out
    tensor_count: int
    data_offset: int  # where tensor data begins: the end of the header, aligned


class _Cursor:
    def __init__(self, buf: mmap.mmap, order: str) -> None:
        self.buf, self.order, self.pos = buf, order, 0

    def take(self, fmt: str) -> tuple:
        fmt = self.order + fmt
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise GGUFFormatError(f"the header ends early (at byte {self.pos})")
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return values

    def string(self) -> bytes:
        (length,) = self.take("Q")
        end = self.pos + length
        if end > len(self.buf):
            raise GGUFFormatError(f"a string runs past the end of the file (at byte {self.pos})")
        raw = self.buf[self.pos : end]
        self.pos = end
        return raw

    def skip_string(self) -> None:
        (length,) = self.take("Q")
        self.pos += length

    def value(self, kind: int) -> object:
        if kind in _FIXED:
            return self.take(_FIXED[kind])[0]
        if kind == _STRING:
            return self.string().decode("utf-8", errors="replace")
        if kind == _ARRAY:
            self.skip_array()
            return None
        raise GGUFFormatError(f"unknown value type {kind} at byte {self.pos}")

    def skip_array(self) -> None:
        kind, count = self.take("IQ")
        if kind in _FIXED:
            self.pos += count * struct.calcsize(_FIXED[kind])
        elif kind == _STRING:
            for _ in range(count):
                self.skip_string()
        elif kind == _ARRAY:
            for _ in range(count):
                self.skip_array()
        else:
            raise GGUFFormatError(f"unknown array type {kind} at byte {self.pos}")
        if self.pos > len(self.buf):
            raise GGUFFormatError("an array runs past the end of the file")


def read_gguf_meta(path: Path) -> GGUFMeta:
    """The scalar metadata and data offset of the GGUF file at path (GGUFFormatError if it is
    not one, OSError if it cannot be read)."""
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != GGUF_MAGIC:
            raise GGUFFormatError("not a GGUF file (no GGUF magic)")
        # The version is small: read in the wrong byte order it has its low bytes zero.
        order = "<"
        cursor = _Cursor(buf, order)
        cursor.pos = 4
        (version,) = cursor.take("I")
        if version & 0xFFFF == 0:
            cursor.order, cursor.pos = ">", 4
            (version,) = cursor.take("I")
        if version not in (2, 3):
            raise GGUFFormatError(f"GGUF version {version} (2 and 3 are read)")
        tensor_count, kv_count = cursor.take("QQ")
        fields: dict[str, object] = {}
        for _ in range(kv_count):
            key = cursor.string().decode("utf-8", errors="replace")
            (kind,) = cursor.take("I")
            value = cursor.value(kind)
            if value is not None:
                fields[key] = value
        for _ in range(tensor_count):  # name, dims, type, offset
            cursor.skip_string()
            (n_dims,) = cursor.take("I")
            cursor.pos += 8 * n_dims + 4 + 8
        if cursor.pos > len(buf):
            raise GGUFFormatError("the tensor table runs past the end of the file")
        alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0:
            raise GGUFFormatError(f"general.alignment is {alignment!r}")
        offset = cursor.pos + (-cursor.pos % alignment)
        return GGUFMeta(version, fields, tensor_count, offset)
