"""Source of ``recipes/data/toolcall_tasks.jsonl``: tool-call tasks written for jointrl.

    python -m rl.data.tasks.toolcall_tasks --out recipes/data/toolcall_tasks.jsonl

Same code, same bytes. Three kinds (``meta["kind"]``; ``meta["source"] == "jointrl"``):

* ``single`` (``"calls"`` mode): one call answers the request.
* ``parallel`` (``"calls"`` mode, ``parallel=True``): 2-3 calls in one turn, in any order.
* ``multi_turn`` (``"answer"`` mode): the policy must call the simulated tools
  (:mod:`envs.toolcall_tools`), read their results, maybe call again, then answer in
  plain text. ``meta["reference"]`` is a reference episode (one assistant text per turn);
  the acceptable answers are computed here by running the simulated tools, so they agree
  with what the env returns.

Calls-mode tasks' expected values are exact (numbers as numbers); an optional parameter
the request does not mention allows ``""`` (omitted) and its schema default if it has one.
Every task offers its needed tools plus one or two distractors, in a shuffled order
(seeded by the task id), and no prefill: the policy writes ``<tool_call>`` itself. The system
message lists the tools (:func:`envs.toolcall.format_tools_system_prompt`), so the rollout does
not give them again through the chat template (:mod:`rollout.tools_prompt`).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import random
from pathlib import Path
from typing import Any

from envs.io import save_tasks
from envs.toolcall import format_call, format_tools_system_prompt
from envs.toolcall_tools import TOOLS, run_tool, tool_schema
from envs.types import ExpectedCall, Message, Task, ToolCall, ToolCallSpec

__all__ = ["SOURCE", "OUT_FILE", "USERS", "ORDERS", "build_tasks", "main"]

SOURCE = "jointrl"
OUT_FILE = "toolcall_tasks.jsonl"

USERS: dict[str, dict[str, Any]] = {
    "7": {"name": "Ben Carter", "email": "ben.carter@mail.com", "city": "Oslo", "currency": "NOK"},
    "15": {"name": "Chen Wei", "email": "chen.wei@example.com", "city": "Singapore", "currency": "USD"},
    "23": {"name": "Dara Okafor", "email": "dara.okafor@startup.io", "city": "Nairobi", "currency": "USD"},
    "31": {"name": "Elena Rossi", "email": "elena.rossi@example.com", "city": "Rome", "currency": "EUR"},
    "42": {"name": "Ana Silva", "email": "ana.silva@example.com", "city": "Lisbon", "currency": "EUR"},
    "58": {"name": "Farid Haddad", "email": "farid.haddad@mail.com", "city": "Cairo", "currency": "USD"},
    "64": {"name": "Greta Lind", "email": "greta.lind@company.org", "city": "Stockholm", "currency": "SEK"},
    "77": {"name": "Hiro Tanaka", "email": "hiro.tanaka@example.com", "city": "Tokyo", "currency": "JPY"},
    "88": {"name": "Isabel Moreno", "email": "isabel.moreno@mail.com", "city": "Madrid", "currency": "EUR"},
    "93": {"name": "Jonas Weber", "email": "jonas.weber@company.org", "city": "Berlin", "currency": "EUR"},
}
ORDERS: dict[str, dict[str, Any]] = {
    "A-1001": {
        "user_id": 42,
        "item": "headphones",
        "status": "shipped",
        "carrier": "DHL",
        "eta": "2024-06-03",
        "total_usd": 120.0,
    },
    "A-1002": {"user_id": 42, "item": "phone case", "status": "processing", "total_usd": 45.5},
    "B-2001": {
        "user_id": 7,
        "item": "rain jacket",
        "status": "delivered",
        "delivered_on": "2024-05-28",
        "total_usd": 89.99,
    },
    "B-2002": {"user_id": 7, "item": "thermos", "status": "cancelled", "total_usd": 24.0},
    "C-3001": {
        "user_id": 15,
        "item": "monitor",
        "status": "shipped",
        "carrier": "FedEx",
        "eta": "2024-06-10",
        "total_usd": 310.0,
    },
    "D-4001": {"user_id": 23, "item": "backpack", "status": "processing", "total_usd": 64.0},
    "E-5001": {
        "user_id": 31,
        "item": "espresso machine",
        "status": "delivered",
        "delivered_on": "2024-05-30",
        "total_usd": 75.0,
    },
    "F-6001": {
        "user_id": 58,
        "item": "desk lamp",
        "status": "shipped",
        "carrier": "UPS",
        "eta": "2024-06-07",
        "total_usd": 39.9,
    },
    "G-7001": {"user_id": 77, "item": "keyboard", "status": "returned", "total_usd": 129.0},
}
DISTRACTORS = (
    "get_weather",
    "convert_currency",
    "search_flights",
    "get_stock_price",
    "convert_units",
    "calculator",
    "set_timer",
    "send_email",
)


def _db(*user_ids: int) -> dict[str, Any]:
    """State with the given users, their orders, and two distractor users (and their orders)."""
    ids = [str(u) for u in user_ids]
    others = sorted(
        (u for u in USERS if u not in ids), key=lambda u: hashlib.sha256(("|".join(ids) + u).encode()).hexdigest()
    )
    keep = sorted(ids + others[:2], key=int)
    users = {u: copy.deepcopy(USERS[u]) for u in keep}
    orders = {o: copy.deepcopy(rec) for o, rec in ORDERS.items() if str(rec["user_id"]) in users}
    return {"users": users, "orders": orders}


def _rng(task_id: str) -> random.Random:
    return random.Random(int(hashlib.sha256(task_id.encode()).hexdigest()[:16], 16))


def _tools(task_id: str, needed: list[str]) -> list[dict[str, Any]]:
    rng = _rng(task_id)
    pool = [n for n in DISTRACTORS if n not in needed]
    names = list(dict.fromkeys(needed)) + rng.sample(pool, rng.choice((1, 2)))
    rng.shuffle(names)
    return [tool_schema(n) for n in names]


def _allowed(name: str, args: dict[str, Any]) -> dict[str, list[Any]]:
    """Exact expected values; unmentioned optional parameters may be omitted (or be their default)."""
    props = TOOLS[name].schema["parameters"]["properties"]
    allowed: dict[str, list[Any]] = {k: [v] for k, v in args.items()}
    for param, schema in props.items():
        if param not in allowed:
            allowed[param] = [""] + ([schema["default"]] if "default" in schema else [])
    return allowed


def _calls_task(
    task_id: str, kind: str, request: str, calls: list[tuple[str, dict[str, Any]]], state: dict[str, Any] | None = None
) -> Task:
    tools = _tools(task_id, [n for n, _ in calls])
    return Task(
        id=task_id,
        domain="tool_call",
        messages=(Message("system", format_tools_system_prompt(tools, parallel=True)), Message("user", request)),
        prefill="",
        tool_call=ToolCallSpec(
            tools=tuple(tools),
            expected=tuple(ExpectedCall(n, _allowed(n, a)) for n, a in calls),
            state=state or {},
            parallel=len(calls) > 1,
        ),
        meta={"kind": kind, "source": SOURCE},
    )


# ----------------------------------------------------------------------------- single calls

_SINGLE: list[tuple[str, str, dict[str, Any]]] = [
    ("What's the weather like in Reykjavik right now?", "get_weather", {"city": "Reykjavik"}),
    ("Tell me the current temperature in Dubai in Fahrenheit.", "get_weather", {"city": "Dubai", "unit": "fahrenheit"}),
    ("Is it raining in Amsterdam today?", "get_weather", {"city": "Amsterdam"}),
    (
        "How many Japanese yen (JPY) would I get for 250 US dollars (USD)?",
        "convert_currency",
        {"amount": 250, "from_currency": "USD", "to_currency": "JPY"},
    ),
    (
        "Convert 1200 Swiss francs (CHF) to euros (EUR).",
        "convert_currency",
        {"amount": 1200, "from_currency": "CHF", "to_currency": "EUR"},
    ),
    (
        "How much is 80 British pounds (GBP) in Canadian dollars (CAD)?",
        "convert_currency",
        {"amount": 80, "from_currency": "GBP", "to_currency": "CAD"},
    ),
    (
        "Find me flights from Lisbon to Athens on 2024-09-14.",
        "search_flights",
        {"origin": "Lisbon", "destination": "Athens", "date": "2024-09-14"},
    ),
    (
        "Are there flights from Seoul to Bangkok on the 3rd of November 2024? Use YYYY-MM-DD for the date.",
        "search_flights",
        {"origin": "Seoul", "destination": "Bangkok", "date": "2024-11-03"},
    ),
    ("What is the current share price of Netflix (ticker NFLX)?", "get_stock_price", {"symbol": "NFLX"}),
    ("Check the IBM stock price for me.", "get_stock_price", {"symbol": "IBM"}),
    ("Get me the latest price of Coca-Cola stock, ticker KO.", "get_stock_price", {"symbol": "KO"}),
    (
        "Convert 26.2 miles (mi) to kilometers (km).",
        "convert_units",
        {"value": 26.2, "from_unit": "mi", "to_unit": "km"},
    ),
    ("How many pounds (lb) is 70 kg?", "convert_units", {"value": 70, "from_unit": "kg", "to_unit": "lb"}),
    ("Convert 3.5 gallons (gal) to liters (l).", "convert_units", {"value": 3.5, "from_unit": "gal", "to_unit": "l"}),
    ("Look up the profile of user 93.", "lookup_user", {"user_id": 93}),
    ("Who is user 58? Look them up.", "lookup_user", {"user_id": 58}),
    ("What's the status of order C-3001?", "get_order_status", {"order_id": "C-3001"}),
    ("Which orders does user 7 have?", "list_user_orders", {"user_id": 7}),
    (
        "Send an email to jonas.weber@company.org with the subject 'Sprint retro moved' and the body "
        "'The retro is now on Thursday at 3pm.'",
        "send_email",
        {
            "to": "jonas.weber@company.org",
            "subject": "Sprint retro moved",
            "body": "The retro is now on Thursday at 3pm.",
        },
    ),
    ("Start a 25 minute timer.", "set_timer", {"minutes": 25}),
]

# ----------------------------------------------------------------------------- parallel calls

_PARALLEL: list[tuple[str, list[tuple[str, dict[str, Any]]]]] = [
    (
        "What's the weather in Tokyo and in Seoul?",
        [("get_weather", {"city": "Tokyo"}), ("get_weather", {"city": "Seoul"})],
    ),
    (
        "Get the stock prices of AAPL, MSFT and GOOGL.",
        [
            ("get_stock_price", {"symbol": "AAPL"}),
            ("get_stock_price", {"symbol": "MSFT"}),
            ("get_stock_price", {"symbol": "GOOGL"}),
        ],
    ),
    (
        "Convert 100 USD to EUR, and also 100 USD to GBP.",
        [
            ("convert_currency", {"amount": 100, "from_currency": "USD", "to_currency": "EUR"}),
            ("convert_currency", {"amount": 100, "from_currency": "USD", "to_currency": "GBP"}),
        ],
    ),
    (
        "Check the status of orders A-1001 and B-2001.",
        [("get_order_status", {"order_id": "A-1001"}), ("get_order_status", {"order_id": "B-2001"})],
    ),
    ("Look up users 15 and 23.", [("lookup_user", {"user_id": 15}), ("lookup_user", {"user_id": 23})]),
    (
        "Find flights from Paris to Rome on 2024-07-01 and back from Rome to Paris on 2024-07-08.",
        [
            ("search_flights", {"origin": "Paris", "destination": "Rome", "date": "2024-07-01"}),
            ("search_flights", {"origin": "Rome", "destination": "Paris", "date": "2024-07-08"}),
        ],
    ),
    (
        "What's the weather in Cairo, and what is TSLA trading at?",
        [("get_weather", {"city": "Cairo"}), ("get_stock_price", {"symbol": "TSLA"})],
    ),
    (
        "Set a 10 minute timer labelled 'pasta' and a 45 minute timer labelled 'bread'.",
        [("set_timer", {"minutes": 10, "label": "pasta"}), ("set_timer", {"minutes": 45, "label": "bread"})],
    ),
    (
        "Convert 5 km to miles (mi), and 10 lb to kg.",
        [
            ("convert_units", {"value": 5, "from_unit": "km", "to_unit": "mi"}),
            ("convert_units", {"value": 10, "from_unit": "lb", "to_unit": "kg"}),
        ],
    ),
    (
        "Email both ana.silva@example.com and ben.carter@mail.com (one email each) with the subject 'Team lunch' "
        "and the body 'Lunch is at noon on Friday.'",
        [
            (
                "send_email",
                {"to": "ana.silva@example.com", "subject": "Team lunch", "body": "Lunch is at noon on Friday."},
            ),
            (
                "send_email",
                {"to": "ben.carter@mail.com", "subject": "Team lunch", "body": "Lunch is at noon on Friday."},
            ),
        ],
    ),
    (
        "What's the weather in Madrid in fahrenheit? Also convert 300 EUR to USD.",
        [
            ("get_weather", {"city": "Madrid", "unit": "fahrenheit"}),
            ("convert_currency", {"amount": 300, "from_currency": "EUR", "to_currency": "USD"}),
        ],
    ),
    (
        "Get the prices of AMD and INTC, and the weather in Denver.",
        [
            ("get_stock_price", {"symbol": "AMD"}),
            ("get_stock_price", {"symbol": "INTC"}),
            ("get_weather", {"city": "Denver"}),
        ],
    ),
    (
        "List the orders of users 42 and 58.",
        [("list_user_orders", {"user_id": 42}), ("list_user_orders", {"user_id": 58})],
    ),
    (
        "Convert 2000 INR to USD, and 50000 KRW to JPY.",
        [
            ("convert_currency", {"amount": 2000, "from_currency": "INR", "to_currency": "USD"}),
            ("convert_currency", {"amount": 50000, "from_currency": "KRW", "to_currency": "JPY"}),
        ],
    ),
    (
        "Search flights from Boston to Chicago and from Boston to Denver, both on 2024-10-05.",
        [
            ("search_flights", {"origin": "Boston", "destination": "Chicago", "date": "2024-10-05"}),
            ("search_flights", {"origin": "Boston", "destination": "Denver", "date": "2024-10-05"}),
        ],
    ),
]

_DB_TOOLS = {"lookup_user", "get_order_status", "list_user_orders"}


def _state_for(calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    users: list[int] = []
    for name, args in calls:
        if "user_id" in args:
            users.append(args["user_id"])
        elif name == "get_order_status":
            users.append(ORDERS[args["order_id"]]["user_id"])
    return _db(*users) if any(n in _DB_TOOLS for n, _ in calls) else {}


# ----------------------------------------------------------------------------- multi-turn


class _Episode:
    """Builds a reference episode by running the simulated tools on the task's state."""

    def __init__(self, state: dict[str, Any]):
        self.state = copy.deepcopy(state)
        self.turns: list[str] = []
        self.tools: list[str] = []

    def call(self, *calls: tuple[str, dict[str, Any]]) -> list[Any]:
        """One turn with these calls; returns their results."""
        self.turns.append("\n".join(format_call(ToolCall(n, a)) for n, a in calls))
        self.tools += [n for n, _ in calls]
        return [run_tool(ToolCall(n, a), self.state) for n, a in calls]

    def answer(self, text: str) -> None:
        self.turns.append(text)


def _money(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def _multi_turn() -> list[tuple[str, dict[str, Any], _Episode, list[str]]]:
    """(request, state, reference episode, acceptable answers) per multi-turn task."""
    out = []

    def add(request: str, state: dict[str, Any], build) -> None:
        ep = _Episode(state)
        answers = build(ep)
        # The reference answer ends with its one answer span, as the system prompt asks.
        ep.turns[-1] += f"\n<answer>{answers[0].replace(' && ', ', ')}</answer>"
        out.append((request, state, ep, answers))

    def weather_of_user(ep: _Episode) -> list[str]:
        (user,) = ep.call(("lookup_user", {"user_id": 42}))
        (w,) = ep.call(("get_weather", {"city": user["city"]}))
        ep.answer(f"User 42 lives in {w['city']}, where it is {w['temperature']} °C and {w['condition']}.")
        return [str(w["temperature"])]

    add("What's the temperature in Celsius in the city where user 42 lives?", _db(42), weather_of_user)

    def warmer(ep: _Episode) -> list[str]:
        cairo, oslo = ep.call(("get_weather", {"city": "Cairo"}), ("get_weather", {"city": "Oslo"}))
        diff = cairo["temperature"] - oslo["temperature"]
        ep.answer(f"Cairo is {diff} °C warmer than Oslo ({cairo['temperature']} °C vs {oslo['temperature']} °C).")
        return [str(diff)]

    add("How many degrees Celsius warmer is Cairo than Oslo right now?", {}, warmer)

    def latest_order(ep: _Episode) -> list[str]:
        (orders,) = ep.call(("list_user_orders", {"user_id": 7}))
        last = max(orders["order_ids"])
        (o,) = ep.call(("get_order_status", {"order_id": last}))
        ep.answer(f"User 7's order with the highest id, {last}, is {o['status']}.")
        return [o["status"]]

    add("What is the status of user 7's order with the highest order id?", _db(7), latest_order)

    def shares_in_eur(ep: _Episode) -> list[str]:
        (p,) = ep.call(("get_stock_price", {"symbol": "MSFT"}))
        (total,) = ep.call(("calculator", {"expression": f"{p['price']} * 10"}))
        (c,) = ep.call(("convert_currency", {"amount": total["result"], "from_currency": "USD", "to_currency": "EUR"}))
        ep.answer(f"10 MSFT shares are worth {_money(total['result'])} USD, which is {_money(c['converted'])} EUR.")
        return [_money(c["converted"]), str(round(c["converted"]))]

    add("How much are 10 shares of MSFT worth in euros (EUR)?", {}, shares_in_eur)

    def eta_and_carrier(ep: _Episode) -> list[str]:
        (o,) = ep.call(("get_order_status", {"order_id": "A-1001"}))
        ep.answer(f"Order A-1001 ships with {o['carrier']} and should arrive on {o['eta']}.")
        assert o["eta"] == "2024-06-03"
        return [f"{o['eta']} && {o['carrier']}", f"June 3 && {o['carrier']}", f"3 June && {o['carrier']}"]

    add("When is order A-1001 expected to arrive, and which carrier is delivering it?", _db(42), eta_and_carrier)

    def email_user(ep: _Episode) -> list[str]:
        (user,) = ep.call(("lookup_user", {"user_id": 31}))
        (sent,) = ep.call(
            ("send_email", {"to": user["email"], "subject": "Your invoice", "body": "Your invoice is attached."})
        )
        ep.answer(f"Done: the email to {user['email']} was sent with message id {sent['message_id']}.")
        return [sent["message_id"]]

    add(
        "Send user 31 an email with the subject 'Your invoice' and the body 'Your invoice is attached.', "
        "then tell me the message id.",
        _db(31),
        email_user,
    )

    def order_total(ep: _Episode) -> list[str]:
        (orders,) = ep.call(("list_user_orders", {"user_id": 42}))
        statuses = ep.call(*[("get_order_status", {"order_id": o}) for o in orders["order_ids"]])
        expr = " + ".join(_money(s["total_usd"]) for s in statuses)
        (total,) = ep.call(("calculator", {"expression": expr}))
        ep.answer(f"User 42's orders add up to {_money(total['result'])} USD.")
        return [_money(total["result"])]

    add("What is the total in USD of all of user 42's orders?", _db(42), order_total)

    def cheapest_flight(ep: _Episode) -> list[str]:
        (user,) = ep.call(("lookup_user", {"user_id": 15}))
        (f,) = ep.call(("search_flights", {"origin": "London", "destination": user["city"], "date": "2024-08-20"}))
        best = min(f["flights"], key=lambda x: (x["price_usd"], x["flight"]))
        ep.answer(
            f"The cheapest flight from London to {user['city']} on 2024-08-20 is {best['flight']} "
            f"at {best['price_usd']} USD, departing {best['departure']}."
        )
        return [best["flight"]]

    add(
        "User 15 wants to fly home from London on 2024-08-20. What is the flight number of the cheapest flight?",
        _db(15),
        cheapest_flight,
    )

    def fahrenheit_of_user(ep: _Episode) -> list[str]:
        (user,) = ep.call(("lookup_user", {"user_id": 77}))
        (w,) = ep.call(("get_weather", {"city": user["city"], "unit": "fahrenheit"}))
        ep.answer(f"It is {w['temperature']} °F in {w['city']}, where user 77 lives.")
        return [str(w["temperature"])]

    add("What's the temperature in Fahrenheit in the city where user 77 lives?", _db(77), fahrenheit_of_user)

    def half_marathon(ep: _Episode) -> list[str]:
        (r,) = ep.call(("convert_units", {"value": 13.1, "from_unit": "mi", "to_unit": "km"}))
        ep.answer(f"A 13.1 mile half marathon is {r['result']} km, about {round(r['result'], 1)} km.")
        return [str(round(r["result"], 1)), str(round(r["result"], 2)), str(r["result"])]

    add("How many kilometers is a 13.1 mile half marathon? Round to one decimal.", {}, half_marathon)

    def portfolio(ep: _Episode) -> list[str]:
        nvda, amd = ep.call(("get_stock_price", {"symbol": "NVDA"}), ("get_stock_price", {"symbol": "AMD"}))
        (t,) = ep.call(("calculator", {"expression": f"3 * {nvda['price']} + 5 * {amd['price']}"}))
        ep.answer(f"3 NVDA shares and 5 AMD shares are worth {_money(t['result'])} USD in total.")
        return [_money(t["result"])]

    add("What are 3 NVDA shares plus 5 AMD shares worth in USD?", {}, portfolio)

    def condition_of_user(ep: _Episode) -> list[str]:
        (user,) = ep.call(("lookup_user", {"user_id": 88}))
        (w,) = ep.call(("get_weather", {"city": user["city"]}))
        ep.answer(f"In {w['city']}, where user 88 lives, it is {w['condition']}.")
        return [w["condition"]]

    add(
        "In one or two words (like 'cloudy'), what's the weather right now in the city where user 88 lives?",
        _db(88),
        condition_of_user,
    )

    def local_currency_total(ep: _Episode) -> list[str]:
        (o,) = ep.call(("get_order_status", {"order_id": "E-5001"}))
        (user,) = ep.call(("lookup_user", {"user_id": o["user_id"]}))
        (c,) = ep.call(
            ("convert_currency", {"amount": o["total_usd"], "from_currency": "USD", "to_currency": user["currency"]})
        )
        ep.answer(
            f"Order E-5001 cost {_money(o['total_usd'])} USD, which is {_money(c['converted'])} "
            f"{user['currency']} in the local currency of {user['name']}."
        )
        return [_money(c["converted"])]

    add(
        "How much did order E-5001 cost in the local currency of the user who placed it?", _db(31), local_currency_total
    )

    def delivered_order(ep: _Episode) -> list[str]:
        (orders,) = ep.call(("list_user_orders", {"user_id": 7}))
        statuses = ep.call(*[("get_order_status", {"order_id": o}) for o in orders["order_ids"]])
        (d,) = [s for s in statuses if s["status"] == "delivered"]
        ep.answer(f"Order {d['order_id']} was delivered on {d['delivered_on']}.")
        assert d["delivered_on"] == "2024-05-28"
        return [f"{d['order_id']} && 2024-05-28", f"{d['order_id']} && May 28", f"{d['order_id']} && 28 May"]

    add("Which of user 7's orders has been delivered, and on what date?", _db(7), delivered_order)

    def percent_plus_stock(ep: _Episode) -> list[str]:
        part, ko = ep.call(("calculator", {"expression": "2480 * 0.175"}), ("get_stock_price", {"symbol": "KO"}))
        (t,) = ep.call(("calculator", {"expression": f"{part['result']} + {ko['price']}"}))
        ep.answer(
            f"17.5% of 2480 is {_money(part['result'])}; plus one KO share ({ko['price']} USD) "
            f"that makes {_money(t['result'])}."
        )
        return [_money(t["result"])]

    add(
        "Compute 17.5% of 2480, then add the current price of one KO share in USD. What is the result?",
        {},
        percent_plus_stock,
    )

    def user_city_diff(ep: _Episode) -> list[str]:
        a, b = ep.call(("lookup_user", {"user_id": 64}), ("lookup_user", {"user_id": 15}))
        wa, wb = ep.call(("get_weather", {"city": a["city"]}), ("get_weather", {"city": b["city"]}))
        diff = abs(wa["temperature"] - wb["temperature"])
        ep.answer(
            f"User 64 is in {wa['city']} ({wa['temperature']} °C) and user 15 in {wb['city']} "
            f"({wb['temperature']} °C): a difference of {diff} °C."
        )
        return [str(diff)]

    add(
        "What is the temperature difference in Celsius between the cities where users 64 and 15 live?",
        _db(64, 15),
        user_city_diff,
    )
    return out


def build_tasks() -> list[Task]:
    """All tasks, in file order: single, parallel, multi-turn."""
    tasks = []
    for i, (request, name, args) in enumerate(_SINGLE, start=1):
        calls = [(name, args)]
        tasks.append(_calls_task(f"jointrl-single-{i:02d}", "single", request, calls, _state_for(calls)))
    for i, (request, calls) in enumerate(_PARALLEL, start=1):
        tasks.append(_calls_task(f"jointrl-parallel-{i:02d}", "parallel", request, calls, _state_for(calls)))
    for i, (request, state, ep, answers) in enumerate(_multi_turn(), start=1):
        task_id = f"jointrl-multi-{i:02d}"
        tools = _tools(task_id, ep.tools)
        system = format_tools_system_prompt(tools, parallel=True, multi_turn=True)
        tasks.append(
            Task(
                id=task_id,
                domain="tool_call",
                messages=(Message("system", system), Message("user", request)),
                prefill="",
                tool_call=ToolCallSpec(
                    tools=tuple(tools),
                    expected=(),
                    mode="answer",
                    answer=tuple(answers),
                    state=state,
                    parallel=any("\n" in t for t in ep.turns[:-1]),
                ),
                meta={"kind": "multi_turn", "source": SOURCE, "reference": list(ep.turns)},
            )
        )
    return tasks


def write_tasks(path: str | Path) -> Path:
    """Write :func:`build_tasks` to ``path`` (``.jsonl``); return the path."""
    p = Path(path)
    save_tasks(build_tasks(), p)
    return p


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rl.data.tasks.toolcall_tasks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", default=f"recipes/data/{OUT_FILE}", help="the .jsonl file to write")
    args = parser.parse_args(argv)
    print(write_tasks(args.out))


if __name__ == "__main__":
    main()
