"""Decode source files to text and back, byte for byte: encoding (PEP 263 cookie), BOM and line endings."""

from __future__ import annotations

import codecs
import io
import tokenize
from dataclasses import dataclass


@dataclass(frozen=True)
class Decoded:
    """A file's text plus what is needed to write it back exactly as it was encoded."""

    text: str
    encoding: str  # a Python codec name; "utf-8-sig" when the file starts with a UTF-8 BOM


def decode_python(data: bytes) -> Decoded:
    """Decode Python source the way the interpreter does (BOM, then coding cookie, else UTF-8).

    Raises UnicodeDecodeError or SyntaxError (bad cookie) when the bytes cannot be decoded.
    Newlines are kept as they are (no universal-newline translation), so CRLF files stay CRLF.
    """
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return Decoded(data.decode(encoding), encoding)


def decode_text(data: bytes) -> Decoded:
    """Decode a non-Python text file: UTF-8 (with or without BOM), else Latin-1 (never fails)."""
    if data.startswith(codecs.BOM_UTF8):
        try:
            return Decoded(data.decode("utf-8-sig"), "utf-8-sig")
        except UnicodeDecodeError:
            pass
    try:
        return Decoded(data.decode("utf-8"), "utf-8")
    except UnicodeDecodeError:
        return Decoded(data.decode("latin-1"), "latin-1")


def encode(text: str, encoding: str) -> bytes:
    """Encode `text` back with the file's own encoding (re-adds a BOM for utf-8-sig).

    Raises UnicodeEncodeError when the new text holds characters the encoding cannot represent.
    """
    return text.encode(encoding)


def check_encodable(text: str, encoding: str, block: int = 1 << 16) -> None:
    """Raise the UnicodeEncodeError encode(text, encoding) would, encoding a block of characters at a time (a
    big file's bytes are never all held)."""
    encoder = codecs.getincrementalencoder(encoding)()
    for at in range(0, len(text), block):
        encoder.encode(text[at:at + block])
    encoder.encode("", final=True)
