r"""The characters an identifier may hold: no control characters, no lone surrogates.

An identifier is a short name the product files, keys and searches by: a principal's or a
resource's type and id, a system, an action, a tool, a decision's ``qid``. Such names are
printable text, so the intake (docs/intake.md, "The event") and the history's query routes
(docs/history.md, "HTTP routes") refuse, with a 400 naming the field or the parameter:

* the control characters of Unicode's general category ``Cc``: C0 (U+0000 to U+001F, NUL
  included), DEL (U+007F) and C1 (U+0080 to U+009F). They end C strings, break log lines and
  terminals, and are never part of a name;
* lone surrogates (U+D800 to U+DFFF), which are not Unicode scalar values (RFC 3629 section 3)
  and cannot be encoded as UTF-8, so no store or broker record can carry them. A JSON body
  cannot deliver one to the intake (its decoder refuses them, RFC 7493 section 2.1); a query
  parameter can, through a JSON-quoted id such as ``Human::"\ud800"``.

Everything else (letters of any script, spaces, punctuation, symbols) is allowed.
"""

from __future__ import annotations

import re

__all__ = ["IDENTIFIER_PATTERN", "identifier_problem"]

#: The rule as a regular expression for pydantic's ``StringConstraints(pattern=...)``: the whole
#: string is free of C0, DEL and C1 control characters. It runs in pydantic-core (Rust ``regex``).
IDENTIFIER_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]*$"

_REFUSED = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def identifier_problem(value: str) -> str | None:
    """Why ``value`` cannot be an identifier, or ``None`` when it can.

    Args:
        value: the text as decoded from the request (any length).

    Returns:
        ``None``, or a message naming the first refused character and its position (0-based),
        like ``holds the control character U+0000 at position 3; identifiers are printable
        text``.

    """
    m = _REFUSED.search(value)
    if m is None:
        return None
    code = ord(m.group())
    if 0xD800 <= code <= 0xDFFF:
        return (
            f"holds the lone surrogate U+{code:04X} at position {m.start()}, "
            "which is not a Unicode character"
        )
    return (
        f"holds the control character U+{code:04X} at position {m.start()}; "
        "identifiers are printable text"
    )
