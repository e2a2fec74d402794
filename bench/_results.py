"""Shared helpers for the bench scripts: machine description and ``bench/RESULTS.md`` sections.

Each script owns one section, delimited by HTML comment markers; re-running a script
replaces its own section and leaves the others alone. Nothing here holds a result.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
TITLE = "# jointrl benchmark results\n\nWritten by the scripts in `bench/`; each section is replaced when its script re-runs.\n"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("" where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def machine() -> str:
    """One line: CPU count, CPU model, total RAM, torch/vllm versions."""
    cpu = cpu_model()
    ram = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / 1024**2:.1f} GiB"
                break
    except OSError:
        pass
    import torch

    try:
        import vllm

        vv = vllm.__version__
    except Exception:  # noqa: BLE001
        vv = "not importable"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{os.cpu_count()} CPUs ({cpu or platform.machine()}), {ram} RAM, {gpu}; "
        f"torch {torch.__version__}, vllm {vv}, python {platform.python_version()}"
    )


def command() -> str:
    return ".venv/bin/python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0])] + sys.argv[1:])


SECTION_KEY = re.compile(r"[a-z0-9_]+")


def add_section_args(ap: argparse.ArgumentParser) -> None:
    """``--section-key`` / ``--section-title``: write a variant's result as a section of its own (a recipe arm, another
    set of held-out files) beside the script's default section, which it would otherwise replace."""
    ap.add_argument(
        "--section-key",
        default="",
        help="the RESULTS.md section's key (its <!-- KEY:start/end --> markers; a-z, 0-9, _) in place of the script's "
        "own, so that a variant's section does not replace the default one",
    )
    ap.add_argument("--section-title", default="", help="the section's heading in place of the script's own")


def section_key_error(key: str) -> str:
    """Why ``key`` cannot name a section ("" when it can): checked before any run trains."""
    if key and not SECTION_KEY.fullmatch(key):
        return f"--section-key {key!r}: a section key is lower-case letters, digits and _ only"
    return ""


def section(key: str, title: str, body: str) -> str:
    """The section ``key`` as RESULTS.md holds it: markers, ``title``, date, machine, load, command, ``body``."""
    start, end = f"<!-- {key}:start -->", f"<!-- {key}:end -->"
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{start}\n## {title}\n\n- date: {now}\n- machine: {machine()}\n"
        f"- load average when written (1 / 5 / 15 min; the benchmark alone keeps it near the core count, more means other work shared the cores): {load}\n"
        f"- command: `{command()}`\n\n{body.rstrip()}\n{end}\n"
    )


def write_section(key: str, title: str, body: str) -> None:
    """Replace (or append) the section ``key`` of RESULTS.md with ``title`` + header + ``body``."""
    start, end = f"<!-- {key}:start -->", f"<!-- {key}:end -->"
    section_text = section(key, title, body)
    text = RESULTS.read_text() if RESULTS.exists() else TITLE
    if start in text and end in text:
        a, b = text.index(start), text.index(end) + len(end)
        text = text[:a] + section_text.rstrip("\n") + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + section_text
    RESULTS.write_text(text)


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A Markdown table (also readable as plain text)."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)
