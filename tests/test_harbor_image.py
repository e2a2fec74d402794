"""Harbor images: the Dockerfile subset (each instruction, each refusal with its line), the base table, the digest,
the host probe, and builds: a scratch image built, cached and raced by two processes (fast), a Debian image with
apt, USER and a shared prefix (slow)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from envs.harbor import userns
from envs.harbor.dockerfile import DockerfileError, parse, plan, resolve_base
from envs.harbor.image import (
    BuiltImage,
    ImageBuildError,
    build_image,
    default_cache_dir,
    image_digest,
    image_plan,
    list_images,
    remove_image,
)
from envs.harbor.task import load_task

REPO = Path(__file__).resolve().parents[1]


def planned(text: str, **kw):
    return plan(parse(textwrap.dedent(text), "Dockerfile"), "Dockerfile", **kw)


def refused(text: str, **kw) -> str:
    with pytest.raises(DockerfileError) as e:
        planned(text, **kw)
    return str(e.value)


# --------------------------------------------------------------------------------------
# The Dockerfile subset
# --------------------------------------------------------------------------------------


def test_continuations_comments_directives_and_both_forms() -> None:
    p = planned(
        """\
        # syntax=docker/dockerfile:1
        # escape=\\
        FROM debian:bookworm-slim
        # a comment
        RUN apt-get update && \\
            # a comment inside the continuation
            apt-get install -y \\
              jq   \\

              git
        RUN ["/bin/echo", "exec", "form"]
        CMD ["bash", "-l"]
        """
    )
    run1, run2 = p.steps
    assert run1.kind == "run" and run1.line == 5
    assert run1.argv[:2] == ("/bin/sh", "-c")
    assert run1.argv[2].split() == ["apt-get", "update", "&&", "apt-get", "install", "-y", "jq", "git"]
    assert run2.argv == ("/bin/echo", "exec", "form") and run2.line == 11
    assert p.cmd == ["bash", "-l"] and p.entrypoint is None


def test_env_arg_substitution_and_workdir() -> None:
    p = planned(
        """\
        ARG SUITE=bookworm
        FROM debian:${SUITE}-slim
        ARG SUITE
        ARG APP=/srv/app
        ARG UNUSED
        ENV A=1 B="two words" C='$A literal' D=${APP}/bin E=${MISSING:-fallback} F=${A:+set}
        ENV G=${A:+set} H=${A:-unused}
        ENV LEGACY spaced value $A
        WORKDIR $APP
        WORKDIR sub/../src
        RUN echo $A
        """,
        build_args={"APP": "/opt/app"},
    )
    assert p.base.suite == "bookworm" and p.base.slim and not p.base.approximate
    assert p.env["A"] == "1" and p.env["B"] == "two words" and p.env["C"] == "$A literal"
    assert p.env["D"] == "/opt/app/bin" and p.env["E"] == "fallback"
    assert p.env["F"] == "" and p.env["G"] == "set" and p.env["H"] == "1"  # one ENV sees the values before it
    assert p.env["LEGACY"] == "spaced value 1" and p.env["PATH"].startswith("/usr/local/sbin")
    assert "APP" not in p.env and "SUITE" not in p.env  # ARG values are build-time only
    assert p.workdir == "/opt/app/src"
    wd1, wd2, run = p.steps
    assert (wd1.kind, wd1.dest, wd2.dest) == ("workdir", "/opt/app", "/opt/app/src")
    assert run.workdir == "/opt/app/src" and run.argv[2] == "echo $A"  # RUN text is the shell's to expand
    env = dict(run.env)
    assert env["APP"] == "/opt/app" and env["SUITE"] == "bookworm" and env["A"] == "1" and "UNUSED" not in env


def test_copy_add_user_shell_entrypoint_and_noops() -> None:
    p = planned(
        """\
        FROM python:3.11-slim
        LABEL maintainer="x" version=2
        EXPOSE 8080
        VOLUME /data
        WORKDIR /app
        COPY --chown=app:app --chmod=755 src/ ./lib/
        COPY a.txt b.txt conf/
        ADD data.tar.gz /srv/
        COPY ["spaced name.txt", "/etc/x.txt"]
        USER app
        SHELL ["/bin/bash", "-o", "pipefail", "-c"]
        RUN echo hi | cat
        ENTRYPOINT ["/entry.sh"]
        """
    )
    c1, c2, c3, c4 = (s for s in p.steps if s.kind == "copy")
    assert c1.argv == ("src/",) and c1.dest == "/app/lib/" and c1.chown == "app:app" and c1.chmod == "755"
    assert c2.argv == ("a.txt", "b.txt") and c2.dest == "/app/conf/"
    assert c3.add and c3.dest == "/srv/"
    assert c4.argv == ("spaced name.txt",) and c4.dest == "/etc/x.txt"
    run = p.steps[-1]
    assert run.argv == ("/bin/bash", "-o", "pipefail", "-c", "echo hi | cat") and run.user == "app"
    assert p.user == "app" and p.entrypoint == ["/entry.sh"] and p.cmd is None  # ENTRYPOINT drops the base's CMD
    assert p.labels == {"maintainer": "x", "version": "2"}
    assert p.base.python == "3.11" and p.env["LANG"] == "C.UTF-8"


def test_heredocs_in_run_and_copy() -> None:
    p = planned(
        """\
        FROM debian:bookworm
        RUN <<EOF
        set -e
        echo one > /one
        EOF
        RUN cat > /two <<'END'
        two $NOT_EXPANDED_HERE
        END
        COPY <<CONF /etc/app.conf
        key = value
        CONF
        CMD echo done
        """
    )
    r1, r2, c = p.steps
    assert r1.argv == ("/bin/sh", "-c", "set -e\necho one > /one\n")
    assert r2.argv[2] == "cat > /two <<'END'\ntwo $NOT_EXPANDED_HERE\nEND\n"
    assert c.argv == ("<<CONF",) and c.inline == (("CONF", "key = value\n"),) and c.dest == "/etc/app.conf"
    assert p.cmd == ["/bin/sh", "-c", "echo done"] and r2.line == 6 and c.line == 9


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("FROM debian:bookworm\nFROM debian:trixie\n", 2, ["multi-stage"]),
        ("FROM debian:bookworm\nCOPY --from=build /a /b\n", 2, ["--from"]),
        ("FROM debian:bookworm\nADD https://example.org/x.tgz /x\n", 2, ["URL"]),
        ("FROM debian:bookworm\nADD git@github.com:a/b.git /b\n", 2, ["URL"]),
        ("FROM debian:bookworm\nONBUILD RUN true\n", 2, ["ONBUILD", "not supported"]),
        ("FROM debian:bookworm\n\nFROBNICATE x\n", 3, ["FROBNICATE"]),
        ("FROM debian:bookworm\nRUN --mount=type=secret,id=x cat /run/secrets/x\n", 2, ["type=cache"]),
        ("FROM debian:bookworm\nRUN --security=insecure true\n", 2, ["--security"]),
        ("# escape=`\nFROM debian:bookworm\n", 1, ["escape"]),
        ("FROM debian:bookworm\nRUN <<EOF\necho never closed\n", 2, ["never closed"]),
        ("RUN true\nFROM debian:bookworm\n", 1, ["before FROM"]),
        ("FROM alpine:3.19\n", 1, ["alpine", "cannot be built"]),
        ("FROM python:3.12-slim\n", 1, ["3.12", "no Debian suite"]),
        ("FROM debian:latest\n", 1, ["moves"]),
        ("FROM ubuntu:18.04\n", 1, ["ubuntu:18.04"]),
        ("FROM debian:bookworm\nCOPY --chmod=u+x a /a\n", 2, ["octal"]),
        ("FROM debian:bookworm\nENV =x\n", 2, ["KEY=value"]),
        ("FROM debian:bookworm\nENV A=${B/x/y}\n", 2, ["only ${VAR}"]),
        ("FROM debian:bookworm\nCOPY onlyone\n", 2, ["sources and a destination"]),
        ("FROM debian:bookworm\nENV A='unclosed\n", 2, ["unclosed single quote"]),
    ],
)
def test_refusals_name_the_line(text: str, line: int, words: list[str]) -> None:
    msg = refused(text)
    assert msg.startswith(f"Dockerfile line {line}:"), msg
    for w in words:
        assert w in msg, (w, msg)


def test_no_from_is_refused() -> None:
    assert "no FROM" in refused("# only a comment\n")


@pytest.mark.parametrize(
    ("ref", "suite", "slim", "python", "approx"),
    [
        ("debian:bookworm-slim", "bookworm", True, "", ""),
        ("debian:bookworm", "bookworm", False, "", ""),
        ("docker.io/library/debian:12-slim", "bookworm", True, "", ""),
        ("debian:trixie", "trixie", False, "", ""),
        ("debian:11", "bullseye", False, "", ""),
        ("debian:12.5-slim", "bookworm", True, "", "today's"),
        ("debian:bookworm-20240110-slim", "bookworm", True, "", "today's"),
        ("debian:bookworm@sha256:" + "a" * 64, "bookworm", False, "", "digest"),
        ("python:3.11-slim", "bookworm", True, "3.11", ""),
        ("python:3.11-slim-bookworm", "bookworm", True, "3.11", ""),
        ("python:3.13-slim", "trixie", True, "3.13", ""),
        ("python:3.13-slim-bookworm", "trixie", True, "3.13", "no Python 3.13"),
        ("python:3.9", "bullseye", True, "3.9", "build tools"),
        ("python:3.11.9-slim", "bookworm", True, "3.11", "as Debian ships it"),
        ("ubuntu:24.04", "trixie", False, "", "ubuntu:24.04"),
        ("ubuntu:22.04", "bookworm", False, "", "ubuntu:22.04"),
    ],
)
def test_base_table(ref: str, suite: str, slim: bool, python: str, approx: str) -> None:
    b = resolve_base(ref)
    assert (b.kind, b.suite, b.slim, b.python) == ("debian", suite, slim, python)
    assert (approx in b.approximate) if approx else b.approximate == ""
    if python:
        assert "python3-pip" in b.packages and "python-is-python3" in b.packages


def test_approximate_bases_can_be_refused() -> None:
    msg = refused("FROM ubuntu:24.04\n", allow_approximate=False)
    assert "line 1" in msg and "approximate" in msg
    assert planned("FROM debian:bookworm-slim\n", allow_approximate=False).base.suite == "bookworm"
    assert resolve_base("scratch").kind == "scratch"


# --------------------------------------------------------------------------------------
# Tasks, digests, the host probe
# --------------------------------------------------------------------------------------


def make_task(
    root: Path, dockerfile: str, files: dict[str, str] | None = None, name: str = "img-task", timeout: int = 120
) -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "task.toml").write_text(f'version = "1.0"\n[environment]\nbuild_timeout_sec = {timeout}\n')
    (d / "instruction.md").write_text("Do the thing.\n")
    (d / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    (d / "environment" / "Dockerfile").write_text(textwrap.dedent(dockerfile))
    for rel, text in (files or {}).items():
        (d / "environment" / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / "environment" / rel).write_text(text)
    return d


def test_a_dockerfile_error_names_the_task_and_file(tmp_path: Path) -> None:
    t = load_task(make_task(tmp_path, "FROM debian:bookworm\nRUN true\nHEALTHCHECK CMD true\nONBUILD RUN x\n"))
    with pytest.raises(DockerfileError) as e:
        image_plan(t)
    assert str(e.value) == f"harbor task {t.path}: environment/Dockerfile line 4: ONBUILD: instruction not supported " \
        "by this builder (docs/envs.md#harbor-tasks)"  # fmt: skip


def test_digest_follows_the_dockerfile_and_context_not_ignored_files(tmp_path: Path) -> None:
    files = {"app/main.py": "print(1)\n", "notes/todo.txt": "x\n", ".dockerignore": "notes\n*.log\n"}
    t = load_task(make_task(tmp_path, "FROM scratch\nCOPY app /app\n", files))
    d0 = image_digest(t, image_plan(t))
    assert d0 == image_digest(t, image_plan(t))
    (t.context / "notes" / "todo.txt").write_text("changed\n")
    (t.context / "build.log").write_text("ignored\n")
    assert image_digest(t, image_plan(t)) == d0
    (t.context / "app" / "main.py").write_text("print(2)\n")
    d1 = image_digest(t, image_plan(t))
    assert d1 != d0
    os.chmod(t.context / "app" / "main.py", 0o755)
    assert image_digest(t, image_plan(t)) != d1
    t.dockerfile.write_text("FROM scratch\nCOPY app /app2\n")
    assert image_digest(t, image_plan(t)) not in (d0, d1)


def test_without_root_the_probe_says_what_the_host_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "subuid"
    empty.write_text("someoneelse:100000:65536\nuser1000:200000:1000\n")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(userns.pwd, "getpwuid", lambda uid: type("P", (), {"pw_name": "user1000"})())
    monkeypatch.setattr(userns.shutil, "which", lambda tool: None if tool == "newgidmap" else f"/usr/bin/{tool}")
    with pytest.raises(userns.HostNotReady) as e:
        userns.id_maps(str(empty), str(tmp_path / "absent"))
    msg = str(e.value)
    assert "uid 1000" in msg and f"`user1000:100000:65536` in {empty}" in msg and "subordinate gids" in msg
    assert "newgidmap" in msg and "uidmap" in msg and "newuidmap" not in msg.split("lacks:")[1].split("newgidmap")[0]
    good = tmp_path / "good"
    good.write_text("user1000:300000:65536\n")
    monkeypatch.setattr(userns.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    maps = userns.id_maps(str(good), str(good))
    assert maps.uid == ((0, 1000, 1), (1, 300000, 65535)) and not maps.privileged
    assert maps.outside_uid(0) == 1000 and maps.outside_uid(42) == 300041


def test_a_failed_probe_is_reported_by_build_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = load_task(make_task(tmp_path, "FROM scratch\nCOPY a /a\n", {"a": "x"}))
    monkeypatch.setattr(userns, "_probe_result", userns.HostNotReady("no user namespaces here (test)"))
    with pytest.raises(userns.HostNotReady, match=r"no user namespaces here \(test\)"):
        build_image(t, cache_dir=tmp_path / "cache")
    monkeypatch.setattr(userns.shutil, "which", lambda tool: None)
    t2 = load_task(make_task(tmp_path, "FROM debian:bookworm\n", name="deb"))
    with pytest.raises(userns.HostNotReady, match="apt-get install mmdebstrap"):
        build_image(t2, cache_dir=tmp_path / "cache")


# --------------------------------------------------------------------------------------
# Builds over a scratch base (no network, no mmdebstrap): fast
# --------------------------------------------------------------------------------------

SCRATCH = """\
FROM scratch
ENV GREETING=hello PATH=/bin
WORKDIR /app
COPY src/ ./
COPY --chown=1000:1000 --chmod=640 secret.txt /home/user/
COPY run.sh tools/
ADD pack.tar.gz /opt/
COPY <<EOF /etc/motd
welcome
EOF
USER 1000
CMD ["/app/run.sh"]
"""


def _scratch_task(tmp_path: Path) -> Path:
    import io
    import tarfile

    d = make_task(
        tmp_path,
        SCRATCH,
        {
            "src/main.py": "print('hi')\n",
            "src/pkg/mod.py": "X = 1\n",
            "src/skip.log": "ignored\n",
            ".dockerignore": "**/*.log\n",
            "secret.txt": "s3cret\n",
            "run.sh": "#!/bin/sh\necho run\n",
        },
    )
    os.chmod(d / "environment" / "run.sh", 0o755)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        data = b"from the archive\n"
        info = tarfile.TarInfo("packed/file.txt")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    (d / "environment" / "pack.tar.gz").write_bytes(buf.getvalue())
    return d


def test_scratch_image_builds_each_instruction_then_is_cached(tmp_path: Path) -> None:
    t = load_task(_scratch_task(tmp_path))
    stale = tmp_path / "cache" / "tmp" / f"build-{image_digest(t, image_plan(t))[:12]}-killed"
    (stale / "root" / "etc").mkdir(parents=True)  # as a build killed outright leaves it
    (tmp_path / "cache" / "tmp" / "prefix-killed").mkdir()
    lines: list[str] = []
    img = build_image(t, cache_dir=tmp_path / "cache", progress=lines.append)
    assert not stale.exists() and not (tmp_path / "cache" / "tmp" / "prefix-killed").exists()
    assert isinstance(img, BuiltImage) and not img.cached
    root = img.root
    assert (root / "app" / "main.py").read_text() == "print('hi')\n"
    assert (root / "app" / "pkg" / "mod.py").is_file() and not (root / "app" / "skip.log").exists()
    secret = root / "home" / "user" / "secret.txt"
    st = secret.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (
        userns.id_maps().outside_uid(1000),
        userns.id_maps().outside_uid(1000),
        0o640,
    )
    assert os.access(root / "app" / "tools" / "run.sh", os.X_OK)
    assert (root / "opt" / "packed" / "file.txt").read_text() == "from the archive\n"
    assert (root / "etc" / "motd").read_text() == "welcome\n"
    assert (img.workdir, img.user, img.cmd, img.entrypoint) == ("/app", "1000", ["/app/run.sh"], None)
    assert img.env == {"GREETING": "hello", "PATH": "/bin"} and img.base == "scratch" and img.approximate == ""
    assert any("step 2/6 COPY src/ ./" in line for line in lines) and any("built in" in line for line in lines)
    again = build_image(t, cache_dir=tmp_path / "cache", progress=lines.append)
    assert again.cached and again.digest == img.digest and again.root == root
    assert [m["digest"] for m in list_images(tmp_path / "cache")] == [img.digest]
    assert not list((tmp_path / "cache" / "tmp").glob("build-*"))  # published by rename, nothing left over
    assert remove_image(img.digest[:8], tmp_path / "cache") == [img.digest]
    assert list_images(tmp_path / "cache") == [] and not root.exists()


def test_copy_follows_image_symlinks_inside_the_root_never_to_the_host(tmp_path: Path) -> None:
    """The image gets /etc/etc-target -> <an absolute host path>; a COPY into it lands inside the image."""
    outside = tmp_path / "host-dir"
    outside.mkdir()
    d = make_task(tmp_path, "FROM scratch\nCOPY link/ /etc/\nCOPY a.txt /etc/etc-target/\n", {"a.txt": "A\n"})
    (d / "environment" / "link").mkdir()
    os.symlink(str(outside), d / "environment" / "link" / "etc-target")
    img = build_image(load_task(d), cache_dir=tmp_path / "cache")
    assert os.readlink(img.root / "etc" / "etc-target") == str(outside)
    assert list(outside.iterdir()) == []  # nothing reached the host directory the link names
    assert (img.root / str(outside).lstrip("/") / "a.txt").read_text() == "A\n"


def test_copy_of_a_missing_source_or_run_without_a_shell_names_the_line(tmp_path: Path) -> None:
    t = load_task(make_task(tmp_path, "FROM scratch\nWORKDIR /w\nCOPY nothere.txt /x\n"))
    with pytest.raises(ImageBuildError) as e:
        build_image(t, cache_dir=tmp_path / "cache")
    assert f"harbor task {t.path}: environment/Dockerfile line 3: COPY nothere.txt /x" in str(e.value)
    assert "not in the build context" in str(e.value)
    t2 = load_task(make_task(tmp_path, "FROM scratch\nRUN true\n", name="norun"))
    with pytest.raises(ImageBuildError, match=r"environment/Dockerfile line 2: RUN true: exit status"):
        build_image(t2, cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache" / "images").glob("*"))  # failed builds publish nothing


def test_unchanged_files_are_hard_linked_to_the_prefix_they_were_copied_from(tmp_path: Path) -> None:
    from envs.harbor.rootfs import share_unchanged

    base, tree = tmp_path / "base", tmp_path / "tree"
    (base / "d").mkdir(parents=True)
    for name in ("same", "rewritten", "appended", "chmodded", "d/deep"):
        (base / name).write_text(name)
    subprocess.run(["cp", "-a", str(base), str(tree)], check=True)
    mark = time.time_ns()
    time.sleep(0.05)
    (tree / "rewritten").write_text("rewritten")  # same size and content, written after the copy
    os.utime(tree / "rewritten", ns=(0, os.lstat(base / "rewritten").st_mtime_ns))  # even with the old mtime back
    with open(tree / "appended", "a") as f:
        f.write("+")
    os.chmod(tree / "chmodded", 0o600)
    (tree / "new").write_text("new")
    assert share_unchanged(str(tree), str(base), mark) == 2
    ino = {n: (os.lstat(base / n).st_ino, os.lstat(tree / n).st_ino) for n in ("same", "d/deep", "rewritten")}
    assert ino["same"][0] == ino["same"][1] and ino["d/deep"][0] == ino["d/deep"][1]
    assert ino["rewritten"][0] != ino["rewritten"][1]
    assert (tree / "appended").read_text() == "appended+" and (base / "appended").read_text() == "appended"
    assert share_unchanged(str(tree), str(base), mark) == 0  # already shared


def test_run_steps_get_their_user_network_and_environment(tmp_path: Path) -> None:
    from envs.harbor.dockerfile import Step
    from envs.harbor.image import _bwrap_argv

    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "setpriv").write_text("")
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\nagent:x:1000:1001::/home/agent:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\nstaff:x:50:\n")
    step = Step(3, "run", "RUN make", ("/bin/sh", "-c", "make"), env=(("A", "1"),), workdir="/src", user="agent")
    argv = _bwrap_argv(str(root), step)
    assert argv[argv.index("--bind") + 1 : argv.index("--bind") + 3] == [str(root), "/"]
    assert argv[argv.index("--chdir") + 1] == "/src" and "--clearenv" in argv
    tail = argv[argv.index("--") + 1 :]
    assert tail == ["/usr/bin/setpriv", "--reuid=1000", "--regid=1001", "--init-groups", "--", "/bin/sh", "-c", "make"]
    env = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--setenv"}
    assert env == {
        "A": "1",
        "HOME": "/home/agent",
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }
    assert "--unshare-net" not in argv and ("/etc/resolv.conf" in argv) == os.path.exists("/etc/resolv.conf")
    offline = _bwrap_argv(str(root), Step(4, "run", "RUN x", ("x",), user="1000:staff", network=False))
    assert "--unshare-net" in offline and "/etc/resolv.conf" not in offline
    assert offline[offline.index("--") + 1 : offline.index("--") + 5] == [
        "/usr/bin/setpriv", "--reuid=1000", "--regid=50", "--clear-groups"
    ]  # fmt: skip
    with pytest.raises(ValueError, match="'nobody' is not in the image's /etc/passwd"):
        _bwrap_argv(str(root), Step(5, "run", "RUN x", ("x",), user="nobody"))
    (root / "usr" / "bin" / "setpriv").unlink()
    with pytest.raises(ValueError, match="setpriv"):
        _bwrap_argv(str(root), step)


def test_a_build_past_its_timeout_leaves_no_process_behind(tmp_path: Path) -> None:
    from envs.harbor.image import _run_host

    pidfile = tmp_path / "pids"
    script = f"sleep 300 & echo $! > {pidfile}; sleep 300"
    status, said = _run_host(["/bin/sh", "-c", script], 1.0, tmp_path)
    assert status == -9 and "timed out" in said
    child = int(pidfile.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]


RACE = """\
import json, sys, time
from envs.harbor import image
from envs.harbor.task import load_task
real = image._Builder.build
def slow(self, root):
    time.sleep(1.5)  # hold the build lock long enough for the other process to arrive
    return real(self, root)
image._Builder.build = slow
lines = []
img = image.build_image(load_task(sys.argv[1]), cache_dir=sys.argv[2], progress=lines.append)
print(json.dumps({"cached": img.cached, "digest": img.digest, "lines": lines}))
"""


def test_two_processes_building_one_image_build_it_once(tmp_path: Path) -> None:
    t = load_task(_scratch_task(tmp_path))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    argv = [sys.executable, "-c", RACE, str(t.path), str(tmp_path / "cache")]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) for _ in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
        outs.append(json.loads(out))
    assert sorted(o["cached"] for o in outs) == [False, True]
    assert outs[0]["digest"] == outs[1]["digest"]
    waited = next(o for o in outs if o["cached"])
    assert any("waiting for another build" in line for line in waited["lines"])
    assert len(list((tmp_path / "cache" / "images").iterdir())) == 1
    assert not list((tmp_path / "cache" / "tmp").glob("build-*"))


# --------------------------------------------------------------------------------------
# A Debian image: mmdebstrap, apt in RUN, USER, the shared prefix (slow). It builds in the suite's image cache
# (``default_cache_dir``: conftest.py sets JOINTRL_CACHE) and starts with the shipped tasks' FROM and package line,
# so it shares their base build (one mmdebstrap and one apt-get per cache).
# --------------------------------------------------------------------------------------

CACHE = default_cache_dir()
DEBIAN = """\
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends gawk gcc git jq libc6-dev make procps python3 sqlite3 && rm -rf /var/lib/apt/lists/*
RUN useradd -m -u 1000 agent
WORKDIR /app
COPY data.json ./
RUN chown agent:agent /app
USER agent
RUN jq -r .name data.json > /app/name.txt && id -u > /app/uid.txt && echo "$HOME" > /app/home.txt
"""


@pytest.mark.slow
def test_debian_image_with_apt_user_and_a_shared_prefix(tmp_path: Path) -> None:
    t = load_task(make_task(tmp_path, DEBIAN, {"data.json": '{"name": "jointrl"}'}, timeout=1800))
    img = build_image(t, cache_dir=CACHE)
    r = img.root
    assert (r / "app" / "name.txt").read_text() == "jointrl\n"
    assert (r / "app" / "uid.txt").read_text() == "1000\n" and (r / "app" / "home.txt").read_text() == "/home/agent\n"
    maps = userns.id_maps()
    assert (r / "app" / "name.txt").stat().st_uid == maps.outside_uid(1000)
    assert (r / "usr" / "bin" / "jq").stat().st_uid == maps.outside_uid(0)
    assert not list((r / "usr" / "share" / "man").glob("*/*"))  # -slim: no man pages
    assert img.user == "agent" and img.workdir == "/app" and img.env["PATH"].startswith("/usr/local/sbin")
    # Another task with the same FROM and leading RUNs starts from the cached prefix.
    lines: list[str] = []
    t2 = load_task(make_task(tmp_path, DEBIAN + "RUN true\n", {"data.json": "{}"}, "other", timeout=1800))
    img2 = build_image(t2, cache_dir=CACHE, progress=lines.append)
    assert not img2.cached and any("from cached prefix" in line and "(2 steps)" in line for line in lines)
    assert not any("mmdebstrap" in line for line in lines)
    # Its files the steps after the prefix left alone share inodes with the prefix (one copy on disk).
    assert (img2.root / "usr" / "bin" / "jq").stat().st_nlink > 1
    assert (img2.root / "app" / "data.json").stat().st_nlink == 1
    remove_image(img2.digest, CACHE)


def test_images_cli_lists_and_removes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rl.cli.main import main

    cache = tmp_path / "cache"
    img = build_image(load_task(make_task(tmp_path, "FROM scratch\nCOPY a /a\n", {"a": "x"})), cache_dir=cache)
    assert main(["images", "ls", "--cache", str(cache)]) == 0
    out = capsys.readouterr().out
    assert img.digest[:12] in out and "scratch" in out and "img-task" in out and "1 image(s)" in out
    assert main(["images", "rm", "abcdef123", "--cache", str(cache)]) == 2
    assert "no image abcdef123" in capsys.readouterr().err
    assert main(["images", "rm", "--cache", str(cache)]) == 2
    assert main(["images", "rm", img.digest[:10], "--prefixes", "--cache", str(cache)]) == 0
    out = capsys.readouterr().out
    assert f"removed {img.digest}" in out and "removed 1 build prefix(es)" in out
    assert main(["images", "ls", "--cache", str(cache)]) == 0
    assert "no images" in capsys.readouterr().out
