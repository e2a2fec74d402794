"""The plain-data wire format between a code candidate and its judge (see :mod:`envs.code`).

Values cross as JSON with a few tagged forms, so that what arrives is always a fresh,
plain value built by ``json.loads``: ``None``, ``bool``, ``int``, ``float`` (``nan``,
``inf`` tagged), ``str``, ``bytes`` (base64), ``complex``, ``list``, ``tuple``, ``dict``
(keys of any of these types), ``set`` and ``frozenset``, nested up to :data:`MAX_DEPTH`.
Subclasses of these are sent as their base value (an ``int`` subclass whose ``__eq__``
always says True arrives as a plain ``int``); anything else (functions, generators,
custom objects) raises :class:`Unsendable` naming the type.

This file is also the source of the codec inside the sandboxed programs: its text is
copied into them (it must stay self-contained: standard library only, no imports from
jointrl).
"""

import base64 as _b64
import json as _json
import math as _math

MAX_DEPTH = 64
MAX_LINE = 32 << 20  # bytes of one message


class Unsendable(TypeError):
    """A value of a type that cannot cross the sandbox boundary."""


def encode(v, depth=0):
    """``v`` as a JSON-ready value (see the module docstring); raises :class:`Unsendable`."""
    if depth > MAX_DEPTH:
        raise Unsendable("a value nested deeper than %d levels (or a cycle)" % MAX_DEPTH)
    if v is None or v is True or v is False:
        return v
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        return int.__index__(v) if type(v) is int else int(int.__index__(v))
    if isinstance(v, float):
        f = float.__float__(v)
        if _math.isfinite(f):
            return f
        return {"$f": "nan" if f != f else ("inf" if f > 0 else "-inf")}
    if isinstance(v, str):
        return str.__str__(v)
    if isinstance(v, (bytes, bytearray)):
        return {"$b": _b64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, complex):
        c = complex(v)
        return {"$c": [encode(c.real, depth + 1), encode(c.imag, depth + 1)]}
    if isinstance(v, tuple):
        return {"$t": [encode(x, depth + 1) for x in tuple.__iter__(v)]}
    if isinstance(v, list):
        return [encode(x, depth + 1) for x in list.__iter__(v)]
    if isinstance(v, frozenset):
        return {"$fs": [encode(x, depth + 1) for x in frozenset.__iter__(v)]}
    if isinstance(v, set):
        return {"$s": [encode(x, depth + 1) for x in set.__iter__(v)]}
    if isinstance(v, dict):
        items = list(dict.items(v))
        if all(type(k) is str and not k.startswith("$") for k, _ in items):
            return {k: encode(x, depth + 1) for k, x in items}
        return {"$d": [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in items]}
    raise Unsendable("a value of type %s" % type(v).__name__)


_FLOATS = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def decode(v, depth=0):
    """The value :func:`encode` produced ``v`` from; raises ``ValueError`` on anything malformed."""
    if depth > MAX_DEPTH + 2:
        raise ValueError("message nested too deeply")
    t = type(v)
    if v is None or t in (bool, int, float, str):
        return v
    if t is list:
        return [decode(x, depth + 1) for x in v]
    if t is not dict:
        raise ValueError("unexpected JSON value of type %s" % t.__name__)
    if len(v) == 1:
        ((tag, body),) = v.items()
        if tag.startswith("$"):
            return _decode_tagged(tag, body, depth)
    if any(k.startswith("$") for k in v):
        raise ValueError("malformed tagged value")
    return {k: decode(x, depth + 1) for k, x in v.items()}


def _decode_tagged(tag, body, depth):
    if tag == "$f" and body in _FLOATS:
        return _FLOATS[body]
    if tag == "$b" and type(body) is str:
        return _b64.b64decode(body.encode("ascii"), validate=True)
    if tag == "$c" and type(body) is list and len(body) == 2:
        re_, im = (decode(x, depth + 1) for x in body)
        if type(re_) is not float or type(im) is not float:
            raise ValueError("malformed complex")
        return complex(re_, im)
    if type(body) is not list:
        raise ValueError("malformed tagged value %s" % tag)
    if tag == "$t":
        return tuple(decode(x, depth + 1) for x in body)
    if tag == "$s":
        return set(decode(x, depth + 1) for x in body)
    if tag == "$fs":
        return frozenset(decode(x, depth + 1) for x in body)
    if tag == "$d":
        out = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("malformed dict item")
            out[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
        return out
    raise ValueError("unknown tag %s" % tag)


def dumps(obj):
    """One message line (bytes, newline-terminated)."""
    return _json.dumps(obj, allow_nan=False, separators=(",", ":")).encode("utf-8") + b"\n"


def loads(line):
    """The message in ``line`` (bytes); raises ``ValueError`` when it is not one JSON object."""
    if len(line) > MAX_LINE:
        raise ValueError("message over %d bytes" % MAX_LINE)
    obj = _json.loads(line.decode("utf-8"))
    if type(obj) is not dict:
        raise ValueError("a message must be a JSON object")
    return obj


def error_text(e, files, where=""):
    """The text of exception ``e`` that a program sends to the host: its last three frames in ``files``
    (file names), the exception line, then ``where``; at most 1500 characters. Where the exception line
    cannot be formatted (a hostile ``__str__`` is handled by ``traceback`` itself), the type's name stands in."""
    import traceback

    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename in files]
    lines = [
        '  File "%s", line %s, in %s\n    %s' % (f.filename, f.lineno, f.name, (f.line or "").strip())
        for f in frames[-3:]
    ]
    try:
        head = "".join(traceback.format_exception_only(type(e), e)).rstrip()
    except BaseException:
        head = type(e).__name__
    text = "\n".join(lines + [head] + ([where] if where else []))
    return text if len(text) <= 1500 else text[:1500] + "..."
