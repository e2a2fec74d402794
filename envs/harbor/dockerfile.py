"""The Dockerfile subset Harbor tasks use, parsed and planned into build steps (no Docker, no daemon).

:func:`parse` turns the text into :class:`Instruction` records (line continuations, comments, parser directives,
heredocs, JSON and shell forms); :func:`plan` resolves them in order (``ARG``/``ENV`` substitution, ``WORKDIR``,
``USER``, the base image through :data:`BASES`) into a :class:`Plan` whose steps ``envs.harbor.image`` executes.
Both are pure and fast: ``jointrl validate`` can check every task's Dockerfile without building anything.

Supported: one ``FROM`` (``scratch``, or a base of the table in :func:`resolve_base`), ``RUN`` (shell and JSON
forms, heredocs, ``--mount=type=cache`` ignored, ``--network=none``), ``COPY``/``ADD`` of the local build context
(``--chown``, ``--chmod``; ``ADD`` extracts a local tar archive as Docker does), ``WORKDIR``, ``ENV``, ``ARG``,
``USER``, ``SHELL``, ``CMD``/``ENTRYPOINT`` (recorded), and ``LABEL``/``EXPOSE``/``VOLUME``/``STOPSIGNAL``/
``HEALTHCHECK``/``MAINTAINER`` (recorded, no effect). Refused, naming the line: multi-stage builds (a second
``FROM``, ``COPY --from``), ``ADD`` of a URL or git source, ``ONBUILD``, other ``RUN --mount`` types, an escape
directive other than backslash, and any other instruction.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace

from envs.harbor.task import HarborTaskError

__all__ = [
    "BASES",
    "Base",
    "DockerfileError",
    "Instruction",
    "Plan",
    "Step",
    "parse",
    "plan",
    "resolve_base",
    "DEFAULT_PATH",
]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_NOOP = {"LABEL", "EXPOSE", "VOLUME", "STOPSIGNAL", "HEALTHCHECK", "MAINTAINER"}
_KNOWN = {"FROM", "RUN", "COPY", "ADD", "WORKDIR", "ENV", "ARG", "USER", "SHELL", "CMD", "ENTRYPOINT"} | _NOOP


class DockerfileError(HarborTaskError):
    """A Dockerfile line this builder cannot build; ``str()`` names the file, the line and the problem."""

    def __init__(self, where: str, line: int, problem: str) -> None:
        self.line = line
        super().__init__(f"{where} line {line}: {problem}" if line else f"{where}: {problem}")


@dataclass(frozen=True)
class Instruction:
    line: int  # 1-based line where the instruction starts
    keyword: str  # upper case
    args: str  # the argument text, continuations joined, heredoc bodies removed
    heredocs: tuple[tuple[str, str], ...] = ()  # (delimiter, body) in order


# --------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------

_CONT = re.compile(r"\\[ \t]*$")
_HEREDOC = re.compile(r"(?<!<)<<(-?)(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")


def parse(text: str, where: str = "Dockerfile") -> list[Instruction]:
    """The instructions of a Dockerfile's text; DockerfileError (``where`` line N: problem) when it is malformed."""
    lines = text.splitlines()
    out: list[Instruction] = []
    i = _directives(lines, where)
    while i < len(lines):
        start, text = i + 1, lines[i].strip()
        i += 1
        if not text or text.startswith("#"):
            continue
        while _CONT.search(text) and i < len(lines):
            text = _CONT.sub("", text)
            nxt = lines[i]
            i += 1
            # A comment or empty line inside a continuation is dropped and the continuation goes on (as in Docker).
            text += "\\" if not nxt.strip() or nxt.strip().startswith("#") else nxt
        joined = _CONT.sub("", text).strip()
        m = re.match(r"^([A-Za-z]+)(?:\s+(.*))?$", joined, re.S)
        if not m:
            raise DockerfileError(where, start, f"cannot read {joined[:60]!r} as an instruction")
        keyword, args = m.group(1).upper(), (m.group(2) or "").strip()
        heredocs: list[tuple[str, str]] = []
        if keyword in ("RUN", "COPY", "ADD"):
            for hm in _HEREDOC.finditer(args):
                body, i = _heredoc_body(lines, i, hm.group(3), bool(hm.group(1)), where, start)
                heredocs.append((hm.group(3), body))
        out.append(Instruction(start, keyword, args, tuple(heredocs)))
    return out


def _directives(lines: list[str], where: str) -> int:
    """Skip the parser directives at the top (``# syntax=``, ``# escape=``, ``# check=``); refuse another escape."""
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*#\s*([a-zA-Z]+)\s*=\s*(.*?)\s*$", lines[i])
        if not m:
            break
        if m.group(1).lower() == "escape" and m.group(2) != "\\":
            raise DockerfileError(where, i + 1, f"escape character {m.group(2)!r} is not supported (only backslash)")
        i += 1
    return i


def _heredoc_body(lines: list[str], i: int, word: str, strip_tabs: bool, where: str, start: int) -> tuple[str, int]:
    body: list[str] = []
    while i < len(lines):
        line = lines[i].lstrip("\t") if strip_tabs else lines[i]
        i += 1
        if line == word:
            return "\n".join(body) + "\n", i
        body.append(line)
    raise DockerfileError(where, start, f"heredoc <<{word} is never closed")


# --------------------------------------------------------------------------------------
# Words and variables
# --------------------------------------------------------------------------------------


def words(text: str, env: dict[str, str], where: str = "Dockerfile", line: int = 0) -> list[str]:
    """Shell-like words of ``text`` as Docker reads ENV/ARG/COPY/WORKDIR/USER arguments: whitespace splits, quotes
    group and are removed, a backslash escapes, ``$VAR``/``${VAR}``/``${VAR:-x}``/``${VAR:+x}`` expand from ``env``
    (not inside single quotes)."""
    out: list[str] = []
    cur: list[str] = []
    have = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            if have:
                out.append("".join(cur))
                cur, have = [], False
            i += 1
        elif c == "'":
            j = text.find("'", i + 1)
            if j < 0:
                raise DockerfileError(where, line, f"unclosed single quote in {text!r}")
            cur.append(text[i + 1 : j])
            have, i = True, j + 1
        elif c == '"':
            i = _double_quoted(text, i + 1, env, cur, where, line)
            have = True
        elif c == "\\" and i + 1 < n:
            cur.append(text[i + 1])
            have, i = True, i + 2
        elif c == "$":
            val, i = _variable(text, i, env, where, line)
            cur.append(val)
            have = True
        else:
            cur.append(c)
            have, i = True, i + 1
    if have:
        out.append("".join(cur))
    return out


def _double_quoted(text: str, i: int, env: dict[str, str], cur: list[str], where: str, line: int) -> int:
    while i < len(text):
        c = text[i]
        if c == '"':
            return i + 1
        if c == "\\" and i + 1 < len(text) and text[i + 1] in '"\\$':
            cur.append(text[i + 1])
            i += 2
        elif c == "$":
            val, i = _variable(text, i, env, where, line)
            cur.append(val)
        else:
            cur.append(c)
            i += 1
    raise DockerfileError(where, line, f"unclosed double quote in {text!r}")


def _variable(text: str, i: int, env: dict[str, str], where: str, line: int) -> tuple[str, int]:
    """Expand the variable reference at ``text[i] == '$'``; return its value and the index after it."""
    m = re.match(r"\$([A-Za-z_][A-Za-z0-9_]*)", text[i:])
    if m:
        return env.get(m.group(1), ""), i + m.end()
    if not text.startswith("${", i):
        return "$", i + 1
    end = text.find("}", i)
    if end < 0:
        raise DockerfileError(where, line, f"unclosed ${{ in {text!r}")
    inner = text[i + 2 : end]
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-+])(.*))?", inner, re.S)
    if not m:
        raise DockerfileError(
            where, line, f"${{{inner}}}: only ${{VAR}}, ${{VAR:-default}}, ${{VAR:+alt}} are supported"
        )
    name, op, word = m.group(1), m.group(2), m.group(3) or ""
    value, is_set = env.get(name), name in env
    if op is None:
        return value or "", end + 1
    word = "".join(words(word, env, where, line)) if word else ""
    present = bool(value) if op.startswith(":") else is_set
    if op.endswith("-"):
        return (value or "") if present else word, end + 1
    return word if present else "", end + 1


def _json_list(args: str) -> list[str] | None:
    """The JSON-array form of an instruction's arguments, or None when it is in shell form (as Docker decides)."""
    if not args.startswith("["):
        return None
    try:
        value = json.loads(args)
    except ValueError:
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


# --------------------------------------------------------------------------------------
# Bases
# --------------------------------------------------------------------------------------

# Debian suite -> (version, the python3 it ships). Suites these builds use; others are refused.
SUITES = {"bullseye": ("11", "3.9"), "bookworm": ("12", "3.11"), "trixie": ("13", "3.13")}
UBUNTU = {"20.04": "bullseye", "22.04": "bookworm", "24.04": "trixie"}  # nearest Debian suite (approximate)
PYTHON_PACKAGES = ("python3", "python3-pip", "python3-venv", "python-is-python3", "ca-certificates")
BASES = """\
| FROM | built as | exact? |
|---|---|---|
| `scratch` | an empty root | yes |
| `debian:<suite>[-slim]`, `debian:<11/12/13>[-slim]` (bullseye, bookworm, trixie) | mmdebstrap `--variant=minbase` of that suite | yes (`-slim` drops docs, man pages, locales) |
| `debian:<suite>-<date>[-slim]`, `debian:12.5`, `...@sha256:...` | that suite, today's packages | approximate |
| `python:3.9*`, `python:3.11*`, `python:3.13*` (`-slim`, `-slim-<suite>`, `-<suite>`) | the Debian suite shipping that Python (3.9 bullseye, 3.11 bookworm, 3.13 trixie) + python3, pip, venv, `python` on PATH, no PEP 668 marker | yes for `-slim`/`-slim-<that suite>`; approximate when the tag names another suite or the full (non-slim) image |
| `python:3.X` of a version no Debian suite ships (3.10, 3.12, 3.14...) | refused | |
| `ubuntu:20.04`, `ubuntu:22.04`, `ubuntu:24.04` | Debian bullseye, bookworm, trixie | approximate; refused with `allow_approximate=False` |
| anything else (alpine, other distributions, private images) | refused | |
"""


@dataclass(frozen=True)
class Base:
    ref: str  # the FROM reference as written (variables expanded)
    kind: str  # "scratch" | "debian"
    suite: str = ""
    slim: bool = True
    packages: tuple[str, ...] = ()  # extra Debian packages (python bases)
    python: str = ""  # the python base's version (its marker and `python` are set up)
    approximate: str = ""  # why the root differs from the named image ("" when it does not)

    def key(self) -> str:
        return json.dumps([self.kind, self.suite, self.slim, list(self.packages), self.python], sort_keys=True)


def resolve_base(ref: str, allow_approximate: bool = True) -> Base:
    """The root a FROM reference is built as (the table :data:`BASES`); ValueError saying why one is refused."""
    name = re.sub(r"^(docker\.io/)?(library/)?", "", ref.strip())
    digest = ""
    if "@" in name:
        name, digest = name.split("@", 1)
    repo, _, tag = name.partition(":")
    tag = tag or "latest"
    if repo == "scratch":
        return Base(ref, "scratch")
    if repo == "debian":
        base = _debian(ref, tag)
    elif repo == "python":
        base = _python(ref, tag)
    elif repo == "ubuntu":
        suite = UBUNTU.get(tag)
        if suite is None:
            raise ValueError(f"ubuntu:{tag} has no Debian stand-in (ubuntu {', '.join(UBUNTU)} do)")
        base = Base(ref, "debian", suite, slim=False, approximate=f"ubuntu:{tag} built as Debian {suite}")
    else:
        raise ValueError(f"base image {ref!r} cannot be built without Docker (bases: docs/envs.md#harbor-tasks)")
    if digest and not base.approximate:
        base = replace(base, approximate=f"digest {digest[:19]}... cannot be pinned: today's {base.suite} packages")
    if base.approximate and not allow_approximate:
        raise ValueError(f"{ref!r} would be approximate ({base.approximate}) and approximate bases are refused")
    return base


def _suite_of(word: str) -> tuple[str, bool]:
    """(suite, exact) for a Debian suite word of a tag: a name, a version, a point release or a dated tag."""
    m = re.fullmatch(r"(bullseye|bookworm|trixie)(?:-(\d{8}))?", word)
    if m:
        return m.group(1), m.group(2) is None
    m = re.fullmatch(r"(11|12|13)(\.\d+)*", word)
    if m:
        suite = next(s for s, (v, _) in SUITES.items() if v == m.group(1))
        return suite, word == m.group(1)
    raise ValueError(f"unknown Debian suite {word!r} (bullseye/11, bookworm/12, trixie/13)")


def _debian(ref: str, tag: str) -> Base:
    if tag in ("latest", "stable", "slim", "stable-slim", "testing", "unstable", "sid"):
        raise ValueError(f"debian:{tag} moves over time: name a suite (debian:bookworm-slim)")
    slim = tag.endswith("-slim")
    suite, exact = _suite_of(tag.removesuffix("-slim"))
    return Base(ref, "debian", suite, slim=slim, approximate="" if exact else f"{ref} built from today's {suite}")


def _python(ref: str, tag: str) -> Base:
    m = re.fullmatch(r"(3\.\d+)(?:\.\d+)?(-slim)?(?:-([a-z]+))?", tag)
    if not m:
        raise ValueError(f"python:{tag}: tags read are 3.X[.Y][-slim][-<suite>]")
    version, slim, named = m.group(1), bool(m.group(2)), m.group(3)
    suite = next((s for s, (_, py) in SUITES.items() if py == version), None)
    if suite is None:
        ships = ", ".join(f"{py} ({s})" for s, (_, py) in SUITES.items())
        raise ValueError(f"python:{tag}: no Debian suite ships Python {version} (Debian ships {ships})")
    notes = []
    if named and named != suite:
        notes.append(f"Debian {named} has no Python {version}: built on {suite}")
    if not slim:
        notes.append("the full python image's build tools are not installed (the -slim set is)")
    if tag.count(".") > 1:
        notes.append(f"Python {version} as Debian ships it, not {tag.split('-')[0]}")
    return Base(ref, "debian", suite, True, PYTHON_PACKAGES, version, "; ".join(notes))


# --------------------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One build action. ``kind``: ``run`` | ``copy`` | ``workdir`` (mkdir) ; state fields are as at this step."""

    line: int
    kind: str
    text: str  # the instruction as written (for progress lines and the prefix key)
    argv: tuple[str, ...] = ()  # run: the command; copy: the sources (context-relative or "<<NAME")
    dest: str = ""  # copy: the destination (absolute); workdir: the directory
    chown: str = ""  # copy: --chown value
    chmod: str = ""  # copy: --chmod value (octal)
    add: bool = False  # copy: ADD (extracts local tar archives)
    inline: tuple[tuple[str, str], ...] = ()  # copy: heredoc sources (name, body)
    env: tuple[tuple[str, str], ...] = ()  # run: the environment (ENV + ARG in scope)
    workdir: str = "/"
    user: str = ""  # run: the USER in force ("" = root)
    network: bool = True  # run: --network=none turns it off


@dataclass(frozen=True)
class Plan:
    base: Base
    steps: tuple[Step, ...]
    env: dict[str, str]  # the image's ENV (ARG values are build-time only)
    workdir: str
    user: str | None
    cmd: list[str] | None
    entrypoint: list[str] | None
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class _State:
    where: str
    build_args: dict[str, str]
    allow_approximate: bool
    base: Base | None = None
    global_args: dict[str, str] = field(default_factory=dict)
    args: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = ""
    shell: tuple[str, ...] = ("/bin/sh", "-c")
    cmd: list[str] | None = None
    entrypoint: list[str] | None = None
    labels: dict[str, str] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)

    def scope(self) -> dict[str, str]:
        """Variables visible to substitution: ARG values, overridden by ENV (as Docker resolves them)."""
        return {**self.args, **self.env}

    def fail(self, ins: Instruction, problem: str) -> DockerfileError:
        return DockerfileError(self.where, ins.line, f"{ins.keyword}: {problem}")


def plan(
    instructions: list[Instruction],
    where: str = "Dockerfile",
    build_args: dict[str, str] | None = None,
    allow_approximate: bool = True,
) -> Plan:
    """Resolve parsed instructions into build steps and the image's configuration (pure: nothing runs)."""
    st = _State(where, dict(build_args or {}), allow_approximate)
    for ins in instructions:
        if ins.keyword not in _KNOWN:
            raise st.fail(ins, "instruction not supported by this builder (docs/envs.md#harbor-tasks)")
        if st.base is None and ins.keyword not in ("FROM", "ARG"):
            raise st.fail(ins, "comes before FROM")
        _HANDLERS.get(ins.keyword, _noop)(st, ins)
    if st.base is None:
        raise DockerfileError(where, 0, "no FROM instruction")
    env = dict(st.env)
    if st.base.kind == "debian":
        env.setdefault("PATH", DEFAULT_PATH)
        if st.base.python:
            env.setdefault("LANG", "C.UTF-8")
    default_cmd = ["python3"] if st.base.python else ["bash"] if st.base.kind == "debian" else None
    cmd = st.cmd if st.cmd is not None else None if st.entrypoint is not None else default_cmd
    return Plan(st.base, tuple(st.steps), env, st.workdir, st.user or None, cmd, st.entrypoint, st.labels)


def _noop(st: _State, ins: Instruction) -> None:
    if ins.keyword == "LABEL":
        pairs = words(ins.args, st.scope(), st.where, ins.line)
        st.labels.update(p.split("=", 1) for p in pairs if "=" in p)


def _from(st: _State, ins: Instruction) -> None:
    if st.base is not None:
        raise st.fail(ins, "a second FROM: multi-stage builds are not supported")
    toks = words(ins.args, st.global_args, st.where, ins.line)
    toks = [t for t in toks if not t.startswith("--platform=")]
    if len(toks) == 3 and toks[1].lower() == "as":
        toks = toks[:1]
    if len(toks) != 1:
        raise st.fail(ins, f"expected `FROM image [AS name]`, got {ins.args!r}")
    try:
        st.base = resolve_base(toks[0], st.allow_approximate)
    except ValueError as exc:
        raise st.fail(ins, str(exc)) from None


def _arg(st: _State, ins: Instruction) -> None:
    for tok in words(ins.args, st.scope() if st.base else st.global_args, st.where, ins.line):
        name, eq, default = tok.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise st.fail(ins, f"bad ARG name {name!r}")
        if st.base is None:
            st.global_args[name] = st.build_args.get(name, default if eq else "")
            continue
        value = st.build_args.get(name, default if eq else st.global_args.get(name))
        if value is not None:
            st.args[name] = value


def _env(st: _State, ins: Instruction) -> None:
    raw = ins.args
    first = raw.split(None, 1)[0] if raw else ""
    if "=" not in first:  # legacy `ENV KEY value with spaces`
        key, _, rest = raw.partition(" ")
        if not key or not rest.strip():
            raise st.fail(ins, f"expected `ENV KEY=value ...` or `ENV KEY value`, got {raw!r}")
        st.env[key] = " ".join(words(rest, st.scope(), st.where, ins.line))
        return
    for tok in words(raw, st.scope(), st.where, ins.line):
        key, eq, value = tok.partition("=")
        if not eq or not key:
            raise st.fail(ins, f"expected KEY=value, got {tok!r}")
        st.env[key] = value


def _workdir(st: _State, ins: Instruction) -> None:
    toks = words(ins.args, st.scope(), st.where, ins.line)
    if len(toks) != 1:
        raise st.fail(ins, f"expected one directory, got {ins.args!r}")
    path = toks[0] if toks[0].startswith("/") else _join(st.workdir, toks[0])
    st.workdir = _norm(path)
    st.steps.append(Step(ins.line, "workdir", f"WORKDIR {st.workdir}", dest=st.workdir, user=st.user))


def _user(st: _State, ins: Instruction) -> None:
    toks = words(ins.args, st.scope(), st.where, ins.line)
    if len(toks) != 1:
        raise st.fail(ins, f"expected one user[:group], got {ins.args!r}")
    st.user = "" if toks[0] in ("root", "0", "root:root", "0:0") else toks[0]


def _exec_form(st: _State, ins: Instruction) -> list[str]:
    argv = _json_list(ins.args)
    return argv if argv is not None else [*st.shell, ins.args]


def _cmd(st: _State, ins: Instruction) -> None:
    if ins.keyword == "CMD":
        st.cmd = _exec_form(st, ins)
    else:
        st.entrypoint = _exec_form(st, ins)
        st.cmd = None  # Docker: ENTRYPOINT resets a CMD set before it (and the base's)


def _shell(st: _State, ins: Instruction) -> None:
    argv = _json_list(ins.args)
    if not argv:
        raise st.fail(ins, 'SHELL takes a JSON list, e.g. ["/bin/bash", "-c"]')
    st.shell = tuple(argv)


def _flags(st: _State, ins: Instruction, text: str) -> tuple[dict[str, str], str]:
    flags: dict[str, str] = {}
    while True:
        m = re.match(r"^--([a-z-]+)(?:=(\S*))?\s*", text)
        if not m:
            return flags, text
        if m.group(1) == "mount":
            flags.setdefault("mount", "")
            flags["mount"] += m.group(2) or ""
            flags["mount"] += ";"
        else:
            flags[m.group(1)] = m.group(2) or ""
        text = text[m.end() :]


def _run(st: _State, ins: Instruction) -> None:
    flags, text = _flags(st, ins, ins.args)
    for mount in filter(None, flags.pop("mount", "").split(";")):
        if "type=cache" not in mount.split(","):
            raise st.fail(ins, f"--mount={mount}: only type=cache mounts are supported (as plain directories)")
    network = flags.pop("network", "default")
    if network not in ("default", "none", "host"):
        raise st.fail(ins, f"--network={network} is not supported (default, none)")
    if flags:
        raise st.fail(ins, f"flags not supported: {', '.join('--' + f for f in flags)}")
    if ins.heredocs and re.fullmatch(r"<<-?['\"]?\w+['\"]?", text.strip()):
        argv = [*st.shell, ins.heredocs[0][1]]  # `RUN <<EOF`: the body is the script
    elif ins.heredocs:
        script = text + "\n" + "".join(f"{body}{word}\n" for word, body in ins.heredocs)
        argv = [*st.shell, script]  # the shell reads its own heredocs
    else:
        argv = _exec_form(st, replace(ins, args=text))
    if not text.strip():
        raise st.fail(ins, "no command")
    env = tuple(sorted(st.scope().items()))
    st.steps.append(
        Step(ins.line, "run", f"RUN {text[:200]}", tuple(argv), env=env, workdir=st.workdir, user=st.user,
             network=network != "none")
    )  # fmt: skip


def _copy(st: _State, ins: Instruction) -> None:
    flags, text = _flags(st, ins, ins.args)
    if "from" in flags:
        raise st.fail(ins, "--from (multi-stage builds) is not supported")
    bad = set(flags) - {"chown", "chmod", "link"}
    if bad:
        raise st.fail(ins, f"flags not supported: {', '.join('--' + f for f in sorted(bad))}")
    toks = _json_list(text)
    toks = toks if toks is not None else words(text, st.scope(), st.where, ins.line)
    if len(toks) < 2:
        raise st.fail(ins, f"expected sources and a destination, got {text!r}")
    *srcs, dest = toks
    for s in srcs:
        if re.match(r"^[a-z][a-z0-9+.-]*://", s) or s.startswith("git@"):
            raise st.fail(ins, f"source {s!r} is a URL: only files of the build context can be copied")
    chmod = flags.get("chmod", "")
    if chmod and not re.fullmatch(r"[0-7]{3,4}", chmod):
        raise st.fail(ins, f"--chmod={chmod}: only octal modes are supported")
    chown = "".join(words(flags.get("chown", ""), st.scope(), st.where, ins.line))
    dest_abs = _norm(dest if dest.startswith("/") else _join(st.workdir, dest))
    if dest.endswith("/") or dest in (".", "..") or dest.endswith("/.") or len(srcs) > 1:
        dest_abs = dest_abs.rstrip("/") + "/"  # a directory: the sources go into it
    inline = tuple((w, b) for w, b in ins.heredocs)
    st.steps.append(
        Step(ins.line, "copy", f"{ins.keyword} {text[:200]}", tuple(srcs), dest_abs, chown, chmod,
             ins.keyword == "ADD", inline, workdir=st.workdir, user=st.user)
    )  # fmt: skip


def _join(base: str, rel: str) -> str:
    return base.rstrip("/") + "/" + rel


def _norm(path: str) -> str:
    parts: list[str] = []
    for p in path.split("/"):
        if p in ("", "."):
            continue
        if p == "..":
            if parts:
                parts.pop()
            continue
        parts.append(p)
    return "/" + "/".join(parts)


_HANDLERS = {
    "FROM": _from,
    "ARG": _arg,
    "ENV": _env,
    "WORKDIR": _workdir,
    "USER": _user,
    "CMD": _cmd,
    "ENTRYPOINT": _cmd,
    "SHELL": _shell,
    "RUN": _run,
    "COPY": _copy,
    "ADD": _copy,
}
