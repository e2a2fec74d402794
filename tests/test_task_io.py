"""Task (de)serialization: envs.io."""

from __future__ import annotations

import gzip
import json

import pytest

from envs.io import TaskFormatError, load_tasks, save_tasks, task_from_dict, task_to_dict
from envs.types import ExpectedCall, Message, Task, ToolCallSpec

TOOL = {
    "name": "get_weather",
    "description": "Get the weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def sample_tasks() -> list[Task]:
    return [
        Task(
            id="tc-1",
            domain="tool_call",
            messages=(Message("system", "tools..."), Message("user", "Weather in Paris?")),
            prefill="<tool_call>",
            tool_call=ToolCallSpec(
                tools=(TOOL,),
                expected=(ExpectedCall("get_weather", {"city": ["Paris"], "unit": ["", "celsius"]}),),
            ),
            meta={"source": "test", "difficulty": 0.5},
        ),
        Task(
            id="code-1",
            domain="code",
            messages=(
                Message("user", "Write add(a, b). ünïcode ✓"),
                Message("assistant", "def add"),
                Message("tool", "ok", name="python"),
            ),
        ),
    ]


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_dict_round_trip():
    for t in sample_tasks():
        d = task_to_dict(t)
        assert json.loads(json.dumps(d)) == d
        assert task_from_dict(d) == t
    minimal = task_to_dict(sample_tasks()[1])
    assert set(minimal) == {"id", "domain", "messages"}  # empty optional fields left out


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_file_round_trip(tmp_path, suffix):
    path = tmp_path / f"sub/tasks{suffix}"
    save_tasks(sample_tasks(), path)
    assert load_tasks(path) == sample_tasks()
    assert load_tasks(str(path)) == sample_tasks()
    first = path.read_bytes()
    save_tasks(sample_tasks(), path)
    assert path.read_bytes() == first  # deterministic, gzip included


def test_gz_written_by_hand_with_blank_lines(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    lines = [json.dumps(task_to_dict(t)) for t in sample_tasks()]
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n" + lines[0] + "\n\n   \n" + lines[1] + "\n")
    assert load_tasks(path) == sample_tasks()


def test_bad_json_names_file_and_line(tmp_path):
    path = tmp_path / "tasks.jsonl"
    good = json.dumps(task_to_dict(sample_tasks()[0]))
    write_lines(path, [good, "", '{"id": "x", "domain": '])
    with pytest.raises(TaskFormatError, match=r"tasks\.jsonl:3: invalid JSON") as exc:
        load_tasks(path)
    assert str(path) in str(exc.value)


def test_bad_json_in_gz_names_line(tmp_path):
    path = tmp_path / "tasks.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("{not json}\n")
    with pytest.raises(TaskFormatError, match=r"tasks\.jsonl\.gz:1: invalid JSON"):
        load_tasks(path)


def test_missing_field_names_file_line_and_field(tmp_path):
    path = tmp_path / "tasks.jsonl"
    d = task_to_dict(sample_tasks()[0])
    del d["domain"]
    write_lines(path, [json.dumps(task_to_dict(sample_tasks()[1])), json.dumps(d)])
    with pytest.raises(TaskFormatError, match=r"tasks\.jsonl:2: field 'domain': missing"):
        load_tasks(path)


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.update(messages=[]), "messages"),
        (lambda d: d["messages"][1].pop("content"), "messages[1].content"),
        (lambda d: d["messages"][0].update(role="robot"), "messages[0].role"),
        (lambda d: d.update(prefill=3), "prefill"),
        (lambda d: d.update(id=7), "id"),
        (lambda d: d.update(extra=1), "extra"),
        (lambda d: d["tool_call"].pop("expected"), "tool_call.expected"),
        (lambda d: d["tool_call"]["expected"][0]["allowed"].update(city="Paris"), "tool_call.expected[0].allowed.city"),
        (lambda d: d["tool_call"]["tools"][0].pop("name"), "tool_call.tools[0].name"),
        (lambda d: d.update(meta=[1]), "meta"),
    ],
)
def test_invalid_fields_named(mutate, field):
    d = task_to_dict(sample_tasks()[0])
    mutate(d)
    with pytest.raises(TaskFormatError) as exc:
        task_from_dict(d, "f.jsonl:9")
    msg = str(exc.value)
    assert msg.startswith("f.jsonl:9: ") and repr(field) in msg, msg


def test_not_an_object(tmp_path):
    path = tmp_path / "tasks.jsonl"
    write_lines(path, ["[1, 2]"])
    with pytest.raises(TaskFormatError, match=r"tasks\.jsonl:1: a task must be a JSON object"):
        load_tasks(path)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_tasks(path)


def test_unsupported_suffix(tmp_path):
    path = tmp_path / "tasks.csv"
    path.write_text("id\n")
    with pytest.raises(ValueError, match="unsupported"):
        load_tasks(path)


def test_duplicate_ids(tmp_path):
    path = tmp_path / "tasks.jsonl"
    t = json.dumps(task_to_dict(sample_tasks()[0]))
    write_lines(path, [t, json.dumps(task_to_dict(sample_tasks()[1])), t])
    with pytest.raises(TaskFormatError, match=r"tasks\.jsonl:3: .*duplicate id 'tc-1' \(first at .*tasks\.jsonl:1\)"):
        load_tasks(path)
    with pytest.raises(TaskFormatError, match="duplicate id"):
        save_tasks([sample_tasks()[0]] * 2, tmp_path / "out.jsonl")


def test_empty_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n\n")
    assert load_tasks(path) == []


def test_parquet_json_string_fields(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = []
    for t in sample_tasks():
        d = task_to_dict(t)
        rows.append(
            {
                "id": d["id"],
                "domain": d["domain"],
                "messages": json.dumps(d["messages"]),
                "prefill": d.get("prefill", ""),
                "tool_call": json.dumps(d["tool_call"]) if "tool_call" in d else None,
                "meta": json.dumps(d.get("meta", {})),
            }
        )
    path = tmp_path / "tasks.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    assert load_tasks(path) == sample_tasks()


def test_parquet_native_nested_columns(tmp_path):
    datasets = pytest.importorskip("datasets")
    # messages as a list of structs (a missing "name" becomes null), tool_call as JSON text
    rows = []
    for t in sample_tasks():
        d = task_to_dict(t)
        rows.append(
            {
                "id": d["id"],
                "domain": d["domain"],
                "messages": [
                    {"role": m["role"], "content": m["content"], "name": m.get("name")} for m in d["messages"]
                ],
                "tool_call": json.dumps(d["tool_call"]) if "tool_call" in d else None,
            }
        )
    path = tmp_path / "tasks.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    loaded = load_tasks(path)
    expected = [Task(id=t.id, domain=t.domain, messages=t.messages, tool_call=t.tool_call) for t in sample_tasks()]
    assert loaded == expected


def test_parquet_bad_row_named(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [
        {"id": "a", "domain": "code", "messages": '[{"role": "user", "content": "hi"}]'},
        {"id": "b", "domain": "code", "messages": "[{broken"},
    ]
    path = tmp_path / "tasks.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    with pytest.raises(
        TaskFormatError, match=r"tasks\.parquet:row 1: field 'messages': is a string but not valid JSON"
    ):
        load_tasks(path)
