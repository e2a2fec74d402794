"""Deterministic generator of the quickstart's tool-call tasks.

    python -m rl.data.tasks.toolcall_gen --out-dir recipes/data

writes ``toolcall_quickstart.train.jsonl`` (200 tasks) and ``toolcall_quickstart.eval.jsonl``
(50 held-out tasks; no user request appears in both). Same seed, same bytes. With
``--ladder`` it writes the graded ``toolcall_ladder.{train,eval}.jsonl`` instead (held out by
phrasing template; see the ladder section below); with ``--chain K``, ``toolcall_chain.{train,eval}.jsonl``:
multi-turn sessions of K ladder requests each, one a turn (:func:`chain_tasks`).

Design (from a GRPO run in which SmolLM2-135M-Instruct learned a task like this):

* The system prompt lists 1-2 function schemas from a pool of eight and the reply format
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, and shows ONE worked example
  for a function that is not among the task's tools, varied across tasks (without any
  example the 135M model scored 0; a function outside the tools means copying never pays).
  The rollout sees that the system message lists the task's tools and does not give them
  again (:mod:`rollout.tools_prompt`), so the prompt is this text with any chat template.
* The user asks for one of the listed functions, in one of several phrasings per function,
  with varied values (cities, currencies, amounts, names...).
* The assistant turn is pre-started with ``<tool_call>`` (``Task.prefill``); without the
  prefill the base model scored 0.
* Expected calls hold exact values (one allowed value, numbers as numbers); an optional
  parameter the user did not mention allows ``""`` (omitted) and, when the schema has a
  default, that default.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.io import save_tasks
from envs.toolcall import format_call, format_tools_system_prompt
from envs.types import ExpectedCall, FollowUp, Message, Task, ToolCall, ToolCallSpec
from rl.data.tasks.ladder import N_EVAL, N_TRAIN, Template, draw, write_ladder

__all__ = [
    "FUNCTIONS",
    "SOURCE",
    "PREFILL",
    "LADDER_SOURCE",
    "generate",
    "write_quickstart",
    "generate_ladder",
    "write_ladder_files",
    "CHAIN_SOURCE",
    "chain_tasks",
    "generate_chains",
    "write_chain_files",
    "main",
]

SOURCE = "toolcall_quickstart"
PREFILL = "<tool_call>"
TRAIN_FILE = f"{SOURCE}.train.jsonl"
EVAL_FILE = f"{SOURCE}.eval.jsonl"

CITIES = [
    "Paris",
    "London",
    "Tokyo",
    "Berlin",
    "Madrid",
    "Rome",
    "New York",
    "Chicago",
    "Toronto",
    "Sydney",
    "Cairo",
    "Mumbai",
    "Seoul",
    "Lisbon",
    "Dublin",
    "Oslo",
    "Vienna",
    "Prague",
    "Boston",
    "Denver",
    "Lima",
    "Nairobi",
    "Bangkok",
    "Istanbul",
    "Athens",
    "Amsterdam",
    "Stockholm",
    "Warsaw",
    "Zurich",
    "Singapore",
    "Dubai",
    "Mexico City",
    "Buenos Aires",
    "Cape Town",
    "Vancouver",
    "Seattle",
    "Miami",
]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "INR", "CNY", "SEK", "NOK", "MXN", "BRL", "KRW"]
PEOPLE = [
    "alice",
    "bob",
    "carol",
    "david",
    "emma",
    "frank",
    "grace",
    "hiro",
    "ines",
    "jamal",
    "kate",
    "leo",
    "maria",
    "nina",
    "omar",
    "priya",
    "sam",
    "tom",
    "yuki",
    "zoe",
]
EMAIL_DOMAINS = ["example.com", "mail.com", "company.org", "startup.io"]
SUBJECTS = [
    "Meeting tomorrow",
    "Project update",
    "Lunch on Friday",
    "Invoice 2041",
    "Quarterly report",
    "Happy birthday",
    "Flight details",
    "Weekly sync notes",
    "Budget review",
    "Welcome aboard",
    "Contract draft",
    "Holiday schedule",
]
RESTAURANTS = [
    "Luigi's",
    "The Green Fork",
    "Sakura Sushi",
    "Casa Lola",
    "Blue Door Bistro",
    "Golden Dragon",
    "Le Petit Cafe",
    "Spice Route",
    "Harbor Grill",
    "Olive Tree",
]
SYMBOLS = ["AAPL", "MSFT", "GOOGL", "AMZN", "TSLA", "NVDA", "META", "NFLX", "IBM", "INTC", "AMD", "ORCL", "KO", "DIS"]
PHRASES = [
    "Good morning",
    "Where is the train station?",
    "Thank you very much",
    "How much does this cost?",
    "I would like a coffee",
    "See you tomorrow",
    "The meeting is at noon",
    "Happy new year",
    "Can you help me?",
    "I love this city",
    "The bill, please",
    "Where can I buy a ticket?",
]
LANGUAGES = [
    "Spanish",
    "French",
    "German",
    "Italian",
    "Japanese",
    "Portuguese",
    "Chinese",
    "Korean",
    "Dutch",
    "Russian",
]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required},
    }


# A sampler returns (user request, arguments the user asked for, allowed values per parameter).
Sample = tuple[str, dict[str, Any], dict[str, list[Any]]]
# How a sampler picks its request's wording among its phrasings: the quickstart draws from all of
# them; the ladder draws train requests and held-out requests from disjoint phrasings.
Pick = Callable[[random.Random, list[str]], str]


def _choice(rng: random.Random, options: list[str]) -> str:
    return rng.choice(options)


@dataclass(frozen=True)
class FunctionSpec:
    schema: dict[str, Any]
    sample: Callable[..., Sample]  # (rng, pick=_choice) -> Sample

    @property
    def name(self) -> str:
        return self.schema["name"]


def _exact(args: dict[str, Any]) -> dict[str, list[Any]]:
    return {k: [v] for k, v in args.items()}


def _sample_weather(rng: random.Random, pick: Pick = _choice) -> Sample:
    city = rng.choice(CITIES)
    if rng.random() < 0.4:
        unit = rng.choice(["celsius", "fahrenheit"])
        text = pick(
            rng,
            [
                "What's the weather in {city} in {unit}?",
                "Give me the current temperature in {city}, in {unit} please.",
                "How warm is it in {city} right now? Use {unit}.",
                "Check the weather for {city} and report it in {unit}.",
            ],
        ).format(city=city, unit=unit)
        args = {"city": city, "unit": unit}
        return text, args, _exact(args)
    text = pick(
        rng,
        [
            "What's the weather like in {city}?",
            "Is it raining in {city} right now?",
            "Can you check the weather in {city} for me?",
            "How is the weather today in {city}?",
            "I'm heading to {city}. What's the weather there?",
        ],
    ).format(city=city)
    return text, {"city": city}, {"city": [city], "unit": ["", "celsius"]}


def _amount(rng: random.Random) -> int | float:
    if rng.random() < 0.6:
        return rng.choice([5, 10, 20, 25, 50, 75, 100, 150, 200, 250, 300, 500, 750, 1000, 1200, 2500, 5000])
    return round(rng.uniform(1, 999), 2)


def _sample_currency(rng: random.Random, pick: Pick = _choice) -> Sample:
    amount = _amount(rng)
    src, dst = rng.sample(CURRENCIES, 2)
    text = pick(
        rng,
        [
            "Convert {amount} {src} to {dst}.",
            "How much is {amount} {src} in {dst}?",
            "What is {amount} {src} worth in {dst}?",
            "I have {amount} {src}. How many {dst} is that?",
            "Please exchange {amount} {src} into {dst}.",
        ],
    ).format(amount=amount, src=src, dst=dst)
    args = {"amount": amount, "from_currency": src, "to_currency": dst}
    return text, args, _exact(args)


def _sample_timer(rng: random.Random, pick: Pick = _choice) -> Sample:
    minutes = rng.randint(1, 90)
    text = pick(
        rng,
        [
            "Set a timer for {m} minutes.",
            "Start a {m} minute timer.",
            "Remind me in {m} minutes with a timer.",
            "Can you put a timer on for {m} minutes?",
            "Timer, {m} minutes please.",
        ],
    ).format(m=minutes)
    args = {"minutes": minutes}
    return text, args, _exact(args)


def _sample_email(rng: random.Random, pick: Pick = _choice) -> Sample:
    to = f"{rng.choice(PEOPLE)}@{rng.choice(EMAIL_DOMAINS)}"
    subject = rng.choice(SUBJECTS)
    text = pick(
        rng,
        [
            'Send an email to {to} with the subject "{subject}".',
            'Email {to}, subject "{subject}".',
            'Please write to {to} using the subject line "{subject}".',
            'Can you send {to} an email titled "{subject}"?',
            'Drop a mail to {to} with subject "{subject}".',
        ],
    ).format(to=to, subject=subject)
    args = {"to": to, "subject": subject}
    return text, args, _exact(args)


def _date(rng: random.Random) -> str:
    month = rng.randint(1, 12)
    day = rng.randint(1, 28)
    return f"2025-{month:02d}-{day:02d}"


def _sample_flights(rng: random.Random, pick: Pick = _choice) -> Sample:
    origin, destination = rng.sample(CITIES, 2)
    date = _date(rng)
    text = pick(
        rng,
        [
            "Find flights from {o} to {d} on {date}.",
            "Search for a flight {o} to {d}, departing {date}.",
            "Are there any flights from {o} to {d} on {date}?",
            "I need to fly from {o} to {d} on {date}. What flights are there?",
            "Look up flights on {date} from {o} to {d}.",
        ],
    ).format(o=origin, d=destination, date=date)
    args = {"origin": origin, "destination": destination, "date": date}
    return text, args, _exact(args)


def _sample_table(rng: random.Random, pick: Pick = _choice) -> Sample:
    restaurant = rng.choice(RESTAURANTS)
    people = rng.randint(1, 12)
    time = f"{rng.randint(12, 21)}:{rng.choice(['00', '15', '30', '45'])}"
    text = pick(
        rng,
        [
            "Book a table at {r} for {p} people at {t}.",
            "Reserve a table for {p} at {r}, {t}.",
            "Can you get us a table for {p} at {r} at {t}?",
            "I'd like a reservation at {r} at {t} for {p} people.",
            "Make a booking at {r}: {p} guests, {t}.",
        ],
    ).format(r=restaurant, p=people, t=time)
    args = {"restaurant": restaurant, "people": people, "time": time}
    return text, args, _exact(args)


def _sample_stock(rng: random.Random, pick: Pick = _choice) -> Sample:
    symbol = rng.choice(SYMBOLS)
    text = pick(
        rng,
        [
            "What's the stock price of {s}?",
            "How much is {s} trading at right now?",
            "Get me the latest price for {s}.",
            "Check the share price of {s}.",
            "Quote for {s}, please.",
        ],
    ).format(s=symbol)
    args = {"symbol": symbol}
    return text, args, _exact(args)


def _sample_translate(rng: random.Random, pick: Pick = _choice) -> Sample:
    phrase = rng.choice(PHRASES)
    target = rng.choice(LANGUAGES)
    if rng.random() < 0.3:
        text = pick(
            rng,
            [
                'Translate "{x}" from English to {t}.',
                'Please translate this English text into {t}: "{x}"',
            ],
        ).format(x=phrase, t=target)
        args = {"text": phrase, "target_language": target, "source_language": "English"}
        return text, args, _exact(args)
    text = pick(
        rng,
        [
            'Translate "{x}" into {t}.',
            'How do you say "{x}" in {t}?',
            'What is "{x}" in {t}?',
            'Can you translate "{x}" to {t} for me?',
        ],
    ).format(x=phrase, t=target)
    args = {"text": phrase, "target_language": target}
    return text, args, {"text": [phrase], "target_language": [target], "source_language": [""]}


_STR = {"type": "string"}

FUNCTIONS: dict[str, FunctionSpec] = {
    f.name: f
    for f in [
        FunctionSpec(
            _fn(
                "get_weather",
                "Get the current weather in a city.",
                {
                    "city": {**_STR, "description": "City name, e.g. Paris"},
                    "unit": {**_STR, "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                },
                ["city"],
            ),
            _sample_weather,
        ),
        FunctionSpec(
            _fn(
                "convert_currency",
                "Convert an amount of money from one currency to another.",
                {
                    "amount": {"type": "number"},
                    "from_currency": {**_STR, "description": "3-letter currency code, e.g. USD"},
                    "to_currency": {**_STR, "description": "3-letter currency code, e.g. EUR"},
                },
                ["amount", "from_currency", "to_currency"],
            ),
            _sample_currency,
        ),
        FunctionSpec(
            _fn("set_timer", "Start a countdown timer.", {"minutes": {"type": "integer", "minimum": 1}}, ["minutes"]),
            _sample_timer,
        ),
        FunctionSpec(
            _fn(
                "send_email",
                "Send an email.",
                {"to": {**_STR, "description": "Recipient email address"}, "subject": _STR},
                ["to", "subject"],
            ),
            _sample_email,
        ),
        FunctionSpec(
            _fn(
                "search_flights",
                "Search for flights between two cities on a date.",
                {
                    "origin": {**_STR, "description": "Departure city"},
                    "destination": {**_STR, "description": "Arrival city"},
                    "date": {**_STR, "description": "Date as YYYY-MM-DD"},
                },
                ["origin", "destination", "date"],
            ),
            _sample_flights,
        ),
        FunctionSpec(
            _fn(
                "book_table",
                "Book a table at a restaurant.",
                {
                    "restaurant": _STR,
                    "people": {"type": "integer", "minimum": 1},
                    "time": {**_STR, "description": "Time as HH:MM (24-hour)"},
                },
                ["restaurant", "people", "time"],
            ),
            _sample_table,
        ),
        FunctionSpec(
            _fn(
                "get_stock_price",
                "Get the latest price of a stock.",
                {"symbol": {**_STR, "description": "Ticker symbol, e.g. AAPL"}},
                ["symbol"],
            ),
            _sample_stock,
        ),
        FunctionSpec(
            _fn(
                "translate_text",
                "Translate text into another language.",
                {
                    "text": _STR,
                    "target_language": {**_STR, "description": "Language name, e.g. Spanish"},
                    "source_language": {**_STR, "description": "Language of the text; optional"},
                },
                ["text", "target_language"],
            ),
            _sample_translate,
        ),
    ]
}


def _make_task(rng: random.Random, target: str) -> tuple[str, Task]:
    """One task whose user asks for ``target``; returns (user request, task without id)."""
    names = list(FUNCTIONS)
    tools = [target]
    if rng.random() < 0.5:
        tools.append(rng.choice([n for n in names if n != target]))
        rng.shuffle(tools)
    example_fn = rng.choice([n for n in names if n not in tools])
    example_text, example_args, _ = FUNCTIONS[example_fn].sample(rng)
    request, _, allowed = FUNCTIONS[target].sample(rng)

    system = format_tools_system_prompt(
        [FUNCTIONS[n].schema for n in tools],
        example=(example_text, ToolCall(name=example_fn, arguments=example_args)),
    )
    task = Task(
        id="",
        domain="tool_call",
        messages=(Message("system", system), Message("user", request)),
        prefill=PREFILL,
        tool_call=ToolCallSpec(
            tools=tuple(FUNCTIONS[n].schema for n in tools),
            expected=(ExpectedCall(name=target, allowed=allowed),),
        ),
        meta={"source": SOURCE, "functions": tools, "example_function": example_fn},
    )
    return request, task


def generate(n_train: int = 200, n_eval: int = 50, seed: int = 0) -> tuple[list[Task], list[Task]]:
    """The train and eval tasks; deterministic in ``seed``; no user request is repeated.

    Target functions cycle through the pool in shuffled rounds, so each split is balanced
    across functions. Tasks are drawn in one stream; the first ``n_train`` unique requests
    are train and the next ``n_eval`` are eval.
    """
    rng = random.Random(seed)
    seen: set[str] = set()
    drawn: list[Task] = []
    order: list[str] = []
    attempts = 0
    while len(drawn) < n_train + n_eval:
        attempts += 1
        if attempts > 100 * (n_train + n_eval) + 1000:
            raise RuntimeError(f"could not draw {n_train + n_eval} distinct requests; the value pools are too small")
        if not order:
            order = list(FUNCTIONS)
            rng.shuffle(order)
        request, task = _make_task(rng, order.pop())
        if request in seen:
            continue
        seen.add(request)
        drawn.append(task)

    def with_ids(tasks: list[Task], split: str) -> list[Task]:
        return [
            Task(
                id=f"{SOURCE}-{split}-{i:04d}",
                domain=t.domain,
                messages=t.messages,
                prefill=t.prefill,
                tool_call=t.tool_call,
                meta=t.meta,
            )
            for i, t in enumerate(tasks)
        ]

    return with_ids(drawn[:n_train], "train"), with_ids(drawn[n_train:], "eval")


def write_quickstart(out_dir: str | Path, n_train: int = 200, n_eval: int = 50, seed: int = 0) -> tuple[Path, Path]:
    """Write the train and eval files into ``out_dir``; return their paths."""
    out = Path(out_dir)
    train, evaluation = generate(n_train=n_train, n_eval=n_eval, seed=seed)
    train_path, eval_path = out / TRAIN_FILE, out / EVAL_FILE
    save_tasks(train, train_path)
    save_tasks(evaluation, eval_path)
    return train_path, eval_path


# ---------------------------------------------------------------------------- the ladder
# A graded task family for joint RL (``toolcall_ladder.{train,eval}.jsonl``): the same
# functions and value pools, with difficulty knobs (how many tools are listed, how many
# arguments the call needs, how much of the call is pre-started), its own system prompt
# (:func:`_ladder_system_prompt`) and held-out phrasings: each request sampler's wordings are split,
# the last ~2/5 of every list serve only held-out tasks, so a held-out gain needs the policy to
# read a request it never saw phrased that way. Rewards give partial credit (format, name,
# arguments: ``rewards.toolcall.ToolCallReward``); "fully correct" is reward 1.0.

LADDER_SOURCE = "toolcall_ladder"
SINGLE_ARG = ("set_timer", "get_stock_price", "get_weather")


def _held_out_count(n: int) -> int:
    return max(1, n * 2 // 5)


def _pick_train(rng: random.Random, options: list[str]) -> str:
    return rng.choice(options[: len(options) - _held_out_count(len(options))])


def _pick_eval(rng: random.Random, options: list[str]) -> str:
    return rng.choice(options[len(options) - _held_out_count(len(options)) :])


def _ladder_prefill(level: str, target: str, first_key: str = "") -> str:
    """The assistant turn's pre-start at a prefill ``level``, for a call of ``target``.

    ``"value"``: up to the first argument's value, after its key's colon (``..."arguments":
    {"city":``; only the values are left to write); ``"args"``: into the arguments object, up
    to the first key's opening quote (the arguments are left); ``"name"``: up to the open name
    string (the function name and arguments are left); ``"tag"``: ``<tool_call>`` (the whole
    JSON is left). Each is a prefix of ``format_call`` of the right call, so the pre-started
    part can never be wrong, and alone it does not parse (a no-op scores 0). Each ends where
    SmolLM2's tokenizer splits the right call's text, so the model continues at a token
    boundary it has seen: it writes ` {"` and ` "` as one token each, and ``":`` ends a key
    (``{"city": "Paris"}`` is ``{"``, ``city``, ``":``, `` "``, ``Paris``...).
    """
    head = f'{PREFILL}{{"name": {json.dumps(target)}, "arguments": {{'
    if level == "value":
        if not first_key:
            raise ValueError(f"prefill level 'value' needs the first argument's key (call of {target!r})")
        return f"{head}{json.dumps(first_key)}:"
    if level == "args":
        return f'{head}"'
    if level == "name":
        return f'{PREFILL}{{"name": "'
    if level == "tag":
        return PREFILL
    raise ValueError(f"unknown prefill level {level!r} (value, args, name, tag)")


def _signature(schema: dict[str, Any]) -> str:
    """One line per function: ``name(param: type, ...): description``, then the parameter notes."""
    params = schema["parameters"]
    required = set(params.get("required", []))
    parts, notes = [], []
    for key, prop in params["properties"].items():
        kind = " | ".join(json.dumps(v) for v in prop["enum"]) if "enum" in prop else prop["type"]
        parts.append(f"{key}: {kind}" + ("" if key in required else " (optional)"))
        if "description" in prop:
            notes.append(f"{key}: {prop['description']}")
    line = f"- {schema['name']}({', '.join(parts)}): {schema['description']}"
    return line + (f" ({'; '.join(notes)})" if notes else "")


def _ladder_system_prompt(schemas: list[dict[str, Any]], example: tuple[str, ToolCall]) -> str:
    """The ladder's system prompt: the functions as one-line signatures and one worked example.

    Not :func:`envs.toolcall.format_tools_system_prompt` (the quickstart's): sampled at
    temperature 0.7 and 1.0 on that prompt, SmolLM2-135M mostly copied its format line's
    placeholder (``{<arguments as a JSON object>}``) or the JSON schema's ``"type"`` and
    ``"properties"`` keys into the arguments (bench/RESULTS.md, "Task ladders: measured
    difficulty"). Here the format is shown only by the example, and no JSON schema is there to copy.
    """
    request, call = example
    return "\n".join(
        [
            "You are a helpful assistant that can call functions. You can call:",
            *(_signature(s) for s in schemas),
            "",
            'Reply with one call: a JSON object with "name" and "arguments" inside <tool_call></tool_call> tags.',
            "",
            "Example:",
            f"User: {request}",
            f"Assistant: {format_call(call)}",
        ]
    )


def _ladder_task(
    rng: random.Random, targets: tuple[str, ...], n_tools: int, prefill: str, examples: tuple[str, ...], pick: Pick
) -> Task:
    """One request for a function of ``targets``, with ``n_tools`` functions listed (the rest
    distractors), the assistant turn pre-started at ``prefill`` level, and a worked example
    for a function of ``examples`` that is not listed."""
    names = list(FUNCTIONS)
    target = rng.choice(list(targets))
    tools = [target] + rng.sample([n for n in names if n != target], n_tools - 1)
    rng.shuffle(tools)
    example_fn = rng.choice([n for n in examples if n not in tools])
    example_text, example_args, _ = FUNCTIONS[example_fn].sample(rng, pick)
    request, args, allowed = FUNCTIONS[target].sample(rng, pick)
    system = _ladder_system_prompt(
        [FUNCTIONS[n].schema for n in tools], (example_text, ToolCall(name=example_fn, arguments=example_args))
    )
    return Task(
        id="",
        domain="tool_call",
        messages=(Message("system", system), Message("user", request)),
        prefill=_ladder_prefill(prefill, target, next(iter(args), "")),
        tool_call=ToolCallSpec(
            tools=tuple(FUNCTIONS[n].schema for n in tools), expected=(ExpectedCall(name=target, allowed=allowed),)
        ),
        meta={"functions": tools, "example_function": example_fn},
    )


# (template, rung, target functions, functions listed, prefill level, example functions).
# How far each rung is pre-started is what gives its tasks signal (0 < pass@k < 1) for SmolLM2-135M
# at temperature 1.0, which wrote a fully right call on no rung with only <tool_call> pre-started.
# Rung 0 (one listed function with one argument; its worked example a one-argument call too, the
# shape of its answer) leaves only the argument value. Rung 1 (one function, any arguments) is
# pre-started up to its first argument's value too: left the arguments, its samples invent argument
# keys. Choosing the name among listed functions is past the 135M model (a rung that left the name
# passed in no sample, the model writing words of the request as the name), so rungs 2-3 keep their
# distractors and give the name: rung 2 (one distractor) up to the first value, as rung 1; rung 3
# (two distractors) into the arguments, leaving every key and value. Each step and its per-rung
# counts: bench/RESULTS.md, "Task ladders: measured difficulty".
LADDER_RUNGS = (
    ("single_arg", 0, SINGLE_ARG, 1, "value", SINGLE_ARG),
    ("one_tool", 1, tuple(FUNCTIONS), 1, "value", tuple(FUNCTIONS)),
    ("two_tools", 2, tuple(FUNCTIONS), 2, "value", tuple(FUNCTIONS)),
    ("three_tools", 3, tuple(FUNCTIONS), 3, "args", tuple(FUNCTIONS)),
)


def ladder_templates() -> tuple[Template, ...]:
    """The ladder's templates (:data:`LADDER_RUNGS`): rung 0 = one listed function with one
    argument, pre-started up to its value; 1 = one listed function, any, pre-started up to its
    first argument's value; 2 = two listed (one distractor), up to its first argument's value too;
    3 = three listed, the name given, every key and value left. Train and eval templates of a
    rung differ in the request phrasings they draw from."""
    out = []
    for name, rung, targets, n_tools, prefill, examples in LADDER_RUNGS:
        for split, pick in (("train", _pick_train), ("eval", _pick_eval)):
            out.append(
                Template(
                    name,
                    rung,
                    split,
                    lambda rng, t=targets, k=n_tools, f=prefill, x=examples, p=pick: _ladder_task(rng, t, k, f, x, p),
                )
            )
    return tuple(out)


def generate_ladder(n_train: int = N_TRAIN, n_eval: int = N_EVAL, seed: int = 0) -> tuple[list[Task], list[Task]]:
    """(train, eval) tool-call ladder tasks; deterministic in ``seed``; no held-out phrasing in train."""
    templates = ladder_templates()
    return (
        draw(templates, "train", n_train, seed, LADDER_SOURCE),
        draw(templates, "eval", n_eval, seed, LADDER_SOURCE),
    )


def write_ladder_files(out_dir: str | Path, n_train: int = N_TRAIN, n_eval: int = N_EVAL, seed: int = 0) -> list[Path]:
    train, held = generate_ladder(n_train, n_eval, seed)
    return write_ladder({"train": train, "eval": held}, out_dir, LADDER_SOURCE)


CHAIN_SOURCE = "toolcall_chain"


def chain_tasks(tasks: list[Task], n: int, length: int, seed: int, split: str) -> list[Task]:
    """``n`` sessions of ``length`` requests each, drawn from ladder ``tasks`` (one split; seeded).

    A session is one calls-mode task with follow-ups (:class:`~envs.types.FollowUp`): its first request is
    one ladder task's, each later request another's, every turn pre-started as its ladder task is (the ladder's
    rungs give signal only with that pre-start). The system prompt lists the first task's functions and every
    later request's function, with a worked example of a function not listed. Sessions draw distinct tasks
    (``random.sample``), so a session never asks the same thing twice; ``meta["chain"]`` names its tasks.
    """
    if length < 1 or n < 0:
        raise ValueError(f"chain_tasks: need length >= 1 and n >= 0, got length={length}, n={n}")
    if len(tasks) < length:
        raise ValueError(f"chain_tasks: {len(tasks)} {split} tasks cannot make sessions of {length} requests")
    rng = random.Random(f"{CHAIN_SOURCE}-{seed}-{split}")
    pick = _pick_train if split == "train" else _pick_eval
    out = []
    for i in range(n):
        parts = rng.sample(tasks, length)
        first = parts[0]
        listed = list(dict.fromkeys([*first.meta["functions"], *(t.tool_call.expected[0].name for t in parts)]))
        example_fn = rng.choice([f for f in FUNCTIONS if f not in listed])
        example_text, example_args, _ = FUNCTIONS[example_fn].sample(rng, pick)
        system = _ladder_system_prompt(
            [FUNCTIONS[f].schema for f in listed], (example_text, ToolCall(name=example_fn, arguments=example_args))
        )
        out.append(
            Task(
                id=f"{CHAIN_SOURCE}-{split}-{i:03d}",
                domain="tool_call",
                messages=(Message("system", system), first.messages[-1]),
                prefill=first.prefill,
                tool_call=ToolCallSpec(
                    tools=tuple(FUNCTIONS[f].schema for f in listed),
                    expected=first.tool_call.expected,
                    followups=tuple(
                        FollowUp(request=t.messages[-1].content, expected=t.tool_call.expected, prefill=t.prefill)
                        for t in parts[1:]
                    ),
                ),
                meta={
                    "source": CHAIN_SOURCE,
                    "template": f"chain{length}",
                    "split": split,
                    "functions": listed,
                    "example_function": example_fn,
                    "chain": [t.id for t in parts],
                },
            )
        )
    return out


def generate_chains(
    length: int = 3, n_train: int = N_TRAIN, n_eval: int = N_EVAL, seed: int = 0
) -> tuple[list[Task], list[Task]]:
    """(train, eval) sessions of ``length`` requests (:func:`chain_tasks`) over the ladder's train and held-out
    tasks: a held-out session's requests are all held-out ladder tasks."""
    train, held = generate_ladder(seed=seed)
    return chain_tasks(train, n_train, length, seed, "train"), chain_tasks(held, n_eval, length, seed, "eval")


def write_chain_files(
    out_dir: str | Path, length: int = 3, n_train: int = N_TRAIN, n_eval: int = N_EVAL, seed: int = 0
) -> list[Path]:
    """Write ``toolcall_chain.{train,eval}.jsonl`` (:func:`generate_chains`) into ``out_dir``; return the paths."""
    train, held = generate_chains(length, n_train, n_eval, seed)
    return write_ladder({"train": train, "eval": held}, out_dir, CHAIN_SOURCE)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rl.data.tasks.toolcall_gen", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default="recipes/data", help="directory to write the two .jsonl files into")
    parser.add_argument("--n-train", type=int, default=200)
    parser.add_argument("--n-eval", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--ladder",
        action="store_true",
        help=f"write the graded ladder (toolcall_ladder.*.jsonl, {N_TRAIN}/{N_EVAL} by default) instead",
    )
    parser.add_argument(
        "--chain",
        type=int,
        default=0,
        metavar="K",
        help="write sessions of K requests over the ladder's tasks (toolcall_chain.*.jsonl) instead",
    )
    args = parser.parse_args(argv)
    # the ladder and its sessions default to the ladder's counts, not the quickstart's
    n_train = N_TRAIN if args.n_train == 200 else args.n_train
    n_eval = N_EVAL if args.n_eval == 50 else args.n_eval
    if args.chain:
        paths = write_chain_files(args.out_dir, args.chain, n_train, n_eval, args.seed)
    elif args.ladder:
        paths = write_ladder_files(args.out_dir, n_train, n_eval, args.seed)
    else:
        paths = write_quickstart(args.out_dir, n_train=args.n_train, n_eval=args.n_eval, seed=args.seed)
    for p in paths:
        print(p)


if __name__ == "__main__":
    main()
