"""Simulated tools for multi-turn tool-call episodes: deterministic, offline, pure Python.

A simulated tool is a function schema (what the policy sees) plus a Python function
``fn(arguments, state) -> JSON-able result``. :func:`run_tool` validates the arguments
against the schema and runs the function; anything wrong (unknown tool, invalid
arguments, unknown city, division by zero...) raises :class:`ToolError`, whose message
the env returns to the policy as ``{"error": <message>}``.

Determinism: no network, no clock, no global randomness. Fixed tables (weather by city,
exchange rates, stock prices, unit factors); ``search_flights`` draws its flights from a
``random.Random`` seeded with a hash of its arguments; ``lookup_user``,
``get_order_status`` and ``list_user_orders`` read the task's ``ToolCallSpec.state``
(``{"users": {"<id>": {...}}, "orders": {"<id>": {...}}}``); ``send_email`` and
``set_timer`` record themselves in the episode's copy of that state (``state["outbox"]``,
``state["timers"]``), so a reward or a test can check what was sent.

``calculator`` evaluates arithmetic with an ``ast`` whitelist (numbers, ``+ - * / // % **``,
unary signs, parentheses and ``abs round min max sqrt``); it never calls ``eval``.
"""

from __future__ import annotations

import ast
import datetime
import hashlib
import json
import math
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from envs.toolcall_schema import validate_arguments
from envs.types import ToolCall

__all__ = ["ToolError", "SimTool", "TOOLS", "tool_schema", "run_tool", "safe_eval", "WEATHER", "USD_RATES", "STOCKS"]


class ToolError(Exception):
    """A tool call that cannot be served; the message goes back to the policy."""


@dataclass(frozen=True)
class SimTool:
    """A simulated tool: the schema the policy sees and its implementation."""

    schema: dict[str, Any]
    fn: Callable[[dict[str, Any], dict[str, Any]], Any]

    @property
    def name(self) -> str:
        return self.schema["name"]


# ----------------------------------------------------------------------------- tables

# city -> (temperature in Celsius, condition, humidity %)
WEATHER: dict[str, tuple[float, str, int]] = {
    "Paris": (18, "cloudy", 72),
    "London": (14, "rain", 85),
    "Tokyo": (22, "sunny", 60),
    "Berlin": (16, "cloudy", 70),
    "Madrid": (27, "sunny", 35),
    "Rome": (25, "sunny", 50),
    "New York": (20, "partly cloudy", 65),
    "Chicago": (12, "windy", 58),
    "Toronto": (9, "snow", 80),
    "Sydney": (24, "sunny", 55),
    "Cairo": (33, "sunny", 20),
    "Mumbai": (31, "humid", 88),
    "Seoul": (17, "partly cloudy", 62),
    "Lisbon": (21, "sunny", 64),
    "Dublin": (11, "rain", 90),
    "Oslo": (5, "snow", 78),
    "Vienna": (15, "cloudy", 68),
    "Prague": (13, "fog", 82),
    "Boston": (10, "rain", 77),
    "Denver": (8, "windy", 40),
    "Nairobi": (23, "partly cloudy", 57),
    "Bangkok": (34, "thunderstorm", 92),
    "Athens": (26, "sunny", 45),
    "Amsterdam": (13, "rain", 87),
    "Stockholm": (7, "cloudy", 75),
    "Zurich": (10, "fog", 83),
    "Singapore": (30, "thunderstorm", 94),
    "Dubai": (38, "sunny", 30),
    "Mexico City": (19, "partly cloudy", 52),
    "Reykjavik": (2, "snow", 81),
}
# currency -> units per 1 USD
USD_RATES: dict[str, float] = {
    "USD": 1.0,
    "EUR": 0.92,
    "GBP": 0.79,
    "JPY": 150.0,
    "CHF": 0.88,
    "CAD": 1.36,
    "AUD": 1.52,
    "INR": 83.0,
    "CNY": 7.2,
    "SEK": 10.5,
    "NOK": 10.6,
    "MXN": 17.0,
    "BRL": 5.0,
    "KRW": 1330.0,
}
# symbol -> price in USD
STOCKS: dict[str, float] = {
    "AAPL": 189.5,
    "MSFT": 415.2,
    "GOOGL": 152.75,
    "AMZN": 178.3,
    "TSLA": 175.0,
    "NVDA": 880.4,
    "META": 495.6,
    "NFLX": 610.0,
    "IBM": 190.25,
    "INTC": 42.8,
    "AMD": 162.4,
    "ORCL": 125.5,
    "KO": 60.15,
    "DIS": 112.0,
}
# unit -> (dimension, factor to the dimension's base unit)
UNITS: dict[str, tuple[str, float]] = {
    "m": ("length", 1.0),
    "km": ("length", 1000.0),
    "cm": ("length", 0.01),
    "mi": ("length", 1609.344),
    "ft": ("length", 0.3048),
    "in": ("length", 0.0254),
    "kg": ("mass", 1.0),
    "g": ("mass", 0.001),
    "lb": ("mass", 0.45359237),
    "oz": ("mass", 0.028349523125),
    "l": ("volume", 1.0),
    "ml": ("volume", 0.001),
    "gal": ("volume", 3.785411784),
}
AIRLINES = ("AF", "BA", "LH", "KL", "IB", "UA", "DL", "JL", "EK", "SK")

_STR = {"type": "string"}
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$")


def _schema(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required, "additionalProperties": False},
    }


def _round(x: float, digits: int = 2) -> float | int:
    """Round to ``digits`` decimals; integral values come back as ``int`` (``18.0 -> 18``)."""
    r = round(float(x), digits)
    return int(r) if r == int(r) and abs(r) < 1e15 else r


def _canonical(table: Mapping[str, Any], key: str, what: str) -> str:
    by_lower = {k.lower(): k for k in table}
    k = by_lower.get(key.strip().lower())
    if k is None:
        raise ToolError(f"unknown {what} {key!r}")
    return k


# ----------------------------------------------------------------------------- implementations


def _get_weather(args: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    city = _canonical(WEATHER, args["city"], "city")
    temp_c, condition, humidity = WEATHER[city]
    unit = args.get("unit", "celsius")
    temp = temp_c if unit == "celsius" else temp_c * 9 / 5 + 32
    return {"city": city, "temperature": _round(temp, 1), "unit": unit, "condition": condition, "humidity": humidity}


def _convert_currency(args: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    src = _canonical(USD_RATES, args["from_currency"], "currency")
    dst = _canonical(USD_RATES, args["to_currency"], "currency")
    amount = args["amount"]
    if amount < 0:
        raise ToolError("amount must be >= 0")
    rate = USD_RATES[dst] / USD_RATES[src]
    return {
        "amount": amount,
        "from_currency": src,
        "to_currency": dst,
        "rate": _round(rate, 6),
        "converted": _round(amount * rate, 2),
    }


def _search_flights(args: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    origin, destination, date = args["origin"].strip(), args["destination"].strip(), args["date"].strip()
    try:
        datetime.date.fromisoformat(date)
    except ValueError:
        raise ToolError(f"date must be YYYY-MM-DD, got {date!r}") from None
    if not origin or not destination:
        raise ToolError("origin and destination must be non-empty")
    if origin.lower() == destination.lower():
        raise ToolError("origin and destination are the same")
    seed = hashlib.sha256(f"{origin.lower()}|{destination.lower()}|{date}".encode()).hexdigest()
    rng = random.Random(int(seed[:16], 16))
    flights = []
    for _ in range(3):
        hour, minute = rng.randrange(5, 23), rng.choice((0, 15, 30, 45))
        airline = rng.choice(AIRLINES)
        flights.append(
            {
                "flight": f"{airline}{rng.randrange(100, 1000)}",
                "departure": f"{hour:02d}:{minute:02d}",
                "duration_min": rng.randrange(60, 720, 5),
                "price_usd": rng.randrange(80, 1200),
            }
        )
    flights.sort(key=lambda f: f["departure"])
    return {"origin": origin, "destination": destination, "date": date, "flights": flights}


def _get_stock_price(args: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    symbol = _canonical(STOCKS, args["symbol"], "symbol")
    return {"symbol": symbol, "price": STOCKS[symbol], "currency": "USD"}


def _convert_units(args: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    src = _canonical(UNITS, args["from_unit"], "unit")
    dst = _canonical(UNITS, args["to_unit"], "unit")
    if UNITS[src][0] != UNITS[dst][0]:
        raise ToolError(f"cannot convert {UNITS[src][0]} ({src}) to {UNITS[dst][0]} ({dst})")
    value = args["value"]
    return {
        "value": value,
        "from_unit": src,
        "to_unit": dst,
        "result": _round(value * UNITS[src][1] / UNITS[dst][1], 4),
    }


def _calculator(args: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    expression = args["expression"]
    return {"expression": expression, "result": safe_eval(expression)}


def _table(state: dict[str, Any], key: str) -> dict[str, Any]:
    table = state.get(key)
    return table if isinstance(table, dict) else {}


def _lookup_user(args: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    user_id = args["user_id"]
    record = _table(state, "users").get(str(user_id))
    if record is None:
        raise ToolError(f"no user with id {user_id}")
    return {"user_id": user_id, **record}


def _get_order_status(args: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    order_id = args["order_id"].strip()
    record = _table(state, "orders").get(order_id)
    if record is None:
        raise ToolError(f"no order with id {order_id!r}")
    return {"order_id": order_id, **record}


def _list_user_orders(args: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    user_id = args["user_id"]
    if str(user_id) not in _table(state, "users"):
        raise ToolError(f"no user with id {user_id}")
    orders = [oid for oid, o in _table(state, "orders").items() if isinstance(o, dict) and o.get("user_id") == user_id]
    return {"user_id": user_id, "order_ids": sorted(orders)}


def _send_email(args: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    to = args["to"].strip()
    if not _EMAIL.match(to):
        raise ToolError(f"invalid email address {to!r}")
    outbox = state.setdefault("outbox", [])
    outbox.append({"to": to, "subject": args["subject"], "body": args.get("body", "")})
    return {"status": "sent", "message_id": f"msg-{len(outbox)}", "to": to}


def _set_timer(args: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    timers = state.setdefault("timers", [])
    timers.append({"minutes": args["minutes"], "label": args.get("label", "")})
    return {"status": "started", "timer_id": f"timer-{len(timers)}", "minutes": args["minutes"]}


TOOLS: dict[str, SimTool] = {
    t.name: t
    for t in [
        SimTool(
            _schema(
                "get_weather",
                "Get the current weather in a city.",
                {
                    "city": {**_STR, "description": "City name, e.g. Paris"},
                    "unit": {**_STR, "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                },
                ["city"],
            ),
            _get_weather,
        ),
        SimTool(
            _schema(
                "convert_currency",
                "Convert an amount of money from one currency to another.",
                {
                    "amount": {"type": "number", "minimum": 0},
                    "from_currency": {**_STR, "description": "3-letter currency code, e.g. USD"},
                    "to_currency": {**_STR, "description": "3-letter currency code, e.g. EUR"},
                },
                ["amount", "from_currency", "to_currency"],
            ),
            _convert_currency,
        ),
        SimTool(
            _schema(
                "search_flights",
                "Search for flights between two cities on a date.",
                {
                    "origin": {**_STR, "description": "Departure city"},
                    "destination": {**_STR, "description": "Arrival city"},
                    "date": {**_STR, "description": "Date as YYYY-MM-DD"},
                },
                ["origin", "destination", "date"],
            ),
            _search_flights,
        ),
        SimTool(
            _schema(
                "get_stock_price",
                "Get the latest price of a stock in USD.",
                {"symbol": {**_STR, "description": "Ticker symbol, e.g. AAPL"}},
                ["symbol"],
            ),
            _get_stock_price,
        ),
        SimTool(
            _schema(
                "convert_units",
                "Convert a length, mass or volume between units.",
                {
                    "value": {"type": "number"},
                    "from_unit": {**_STR, "enum": sorted(UNITS)},
                    "to_unit": {**_STR, "enum": sorted(UNITS)},
                },
                ["value", "from_unit", "to_unit"],
            ),
            _convert_units,
        ),
        SimTool(
            _schema(
                "calculator",
                "Evaluate an arithmetic expression (+ - * / // % **, parentheses, abs, round, min, max, sqrt).",
                {"expression": {**_STR, "description": "e.g. (12.5 * 4) + 3"}},
                ["expression"],
            ),
            _calculator,
        ),
        SimTool(
            _schema(
                "lookup_user",
                "Look up a user's profile by user id.",
                {"user_id": {"type": "integer", "description": "Numeric user id"}},
                ["user_id"],
            ),
            _lookup_user,
        ),
        SimTool(
            _schema(
                "get_order_status",
                "Get the status of an order by order id.",
                {"order_id": {**_STR, "description": "Order id, e.g. A-1001"}},
                ["order_id"],
            ),
            _get_order_status,
        ),
        SimTool(
            _schema(
                "list_user_orders",
                "List the order ids of a user.",
                {"user_id": {"type": "integer", "description": "Numeric user id"}},
                ["user_id"],
            ),
            _list_user_orders,
        ),
        SimTool(
            _schema(
                "send_email",
                "Send an email.",
                {
                    "to": {**_STR, "description": "Recipient email address"},
                    "subject": _STR,
                    "body": {**_STR, "description": "Message text; optional"},
                },
                ["to", "subject"],
            ),
            _send_email,
        ),
        SimTool(
            _schema(
                "set_timer",
                "Start a countdown timer.",
                {"minutes": {"type": "integer", "minimum": 1}, "label": {**_STR, "description": "Optional label"}},
                ["minutes"],
            ),
            _set_timer,
        ),
    ]
}


def tool_schema(name: str) -> dict[str, Any]:
    """A copy of simulated tool ``name``'s function schema (``KeyError`` if there is none)."""
    return json.loads(json.dumps(TOOLS[name].schema))


def run_tool(call: ToolCall, state: dict[str, Any] | None = None, registry: Mapping[str, SimTool] | None = None) -> Any:
    """Run ``call`` on its simulated tool; return its JSON-able result or raise :class:`ToolError`.

    The arguments are validated against the tool's own schema first. ``state`` is the
    episode's (mutable) copy of the task's state; tools that record (``send_email``,
    ``set_timer``) append to it.
    """
    registry = TOOLS if registry is None else registry
    tool = registry.get(call.name)
    if tool is None:
        raise ToolError(f"function {call.name!r} has no simulated implementation")
    errors = validate_arguments(call, [tool.schema])
    if errors:
        raise ToolError("invalid arguments: " + "; ".join(errors))
    for name, value in call.arguments.items():
        _check_argument_size(name, value)
    return tool.fn(dict(call.arguments), {} if state is None else state)


def _check_argument_size(name: str, value: Any) -> None:
    """A numeric argument beyond 1e100 (a 400-digit integer, say) is a :class:`ToolError` the
    model sees, never an ``OverflowError`` from a tool's float arithmetic."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
        if abs(value) > _MAX_MAGNITUDE:
            raise ToolError(f"argument {name!r} is too large (at most 1e100 in magnitude)")
    elif isinstance(value, list):
        for v in value:
            _check_argument_size(name, v)
    elif isinstance(value, dict):
        for v in value.values():
            _check_argument_size(name, v)


# ----------------------------------------------------------------------------- safe arithmetic

_MAX_EXPR_CHARS = 200
_MAX_MAGNITUDE = 1e100
_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
}
_FUNCS: dict[str, tuple[Callable[..., Any], int, int]] = {  # name -> (function, min args, max args)
    "abs": (abs, 1, 1),
    "round": (round, 1, 2),
    "min": (min, 2, 16),
    "max": (max, 2, 16),
    "sqrt": (math.sqrt, 1, 1),
}


def _check_magnitude(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        raise ToolError("result is not a finite number")
    if abs(x) > _MAX_MAGNITUDE:
        raise ToolError("result too large")
    return x


def _eval_node(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ToolError(f"unsupported constant {node.value!r}")
        return _check_magnitude(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _eval_node(node.operand)
        return v if isinstance(node.op, ast.UAdd) else -v
    if isinstance(node, ast.BinOp):
        op = _BINOPS.get(type(node.op))
        if op is None:
            hint = " (use ** for powers)" if isinstance(node.op, ast.BitXor) else ""
            raise ToolError(f"unsupported operator {type(node.op).__name__}{hint}")
        a, b = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow):
            if a == 0 and b < 0:
                raise ToolError("division by zero")
            if a != 0 and abs(b) * math.log10(abs(a)) > math.log10(_MAX_MAGNITUDE):
                raise ToolError("result too large")
            if a < 0 and b != int(b):
                raise ToolError("fractional power of a negative number")
        try:
            return _check_magnitude(op(a, b))
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("result too large") from None
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS:
            what = node.func.id if isinstance(node.func, ast.Name) else type(node.func).__name__
            raise ToolError(f"unsupported function {what!r} (allowed: {', '.join(_FUNCS)})")
        if node.keywords:
            raise ToolError("keyword arguments are not supported")
        fn, lo, hi = _FUNCS[node.func.id]
        if not lo <= len(node.args) <= hi:
            raise ToolError(f"{node.func.id}() takes {lo}..{hi} arguments, got {len(node.args)}")
        values = [_eval_node(a) for a in node.args]
        if node.func.id == "round" and len(values) == 2 and (not isinstance(values[1], int) or abs(values[1]) > 15):
            raise ToolError("round()'s digits must be an integer in -15..15")
        if node.func.id == "sqrt" and values[0] < 0:
            raise ToolError("sqrt of a negative number")
        return _check_magnitude(fn(*values))
    raise ToolError(
        f"unsupported expression element {type(node).__name__}"
        + (f" {node.id!r}" if isinstance(node, ast.Name) else "")
    )


def safe_eval(expression: str) -> int | float:
    """Evaluate an arithmetic ``expression`` with an ``ast`` whitelist (never ``eval``).

    Allowed: int/float literals, ``+ - * / // % **``, unary ``+ -``, parentheses and the
    functions ``abs round min max sqrt``. Everything else (names, attributes, strings,
    comprehensions, ``__import__``...) raises :class:`ToolError`, as do division by zero,
    expressions over 200 characters and magnitudes over 1e100. Floats are rounded to 10
    decimals; integral float results stay floats (``10 / 2 == 5.0``).
    """
    if not isinstance(expression, str):
        raise ToolError("expression must be a string")
    if len(expression) > _MAX_EXPR_CHARS:
        raise ToolError(f"expression longer than {_MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"invalid expression: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
        raise ToolError(f"invalid expression: {type(exc).__name__}") from None
    try:
        value = _eval_node(tree)
    except RecursionError:
        raise ToolError("expression nested too deeply") from None
    return round(value, 10) if isinstance(value, float) else value
