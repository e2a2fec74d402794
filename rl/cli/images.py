"""``jointrl images ls|rm``: the Harbor task images cached on this node (``envs.harbor.image``).

``ls`` prints one line per image (digest, its own size: the bytes it does not share with a cached prefix, build
time, base, the task that built it, approximate bases marked); ``rm DIGEST...`` removes images by digest prefix, ``rm --all`` every image, ``--prefixes`` also the
cached build prefixes (base trees); remove nothing a running training run still uses. ``--cache DIR`` (default ``$JOINTRL_IMAGE_CACHE``, else
``$JOINTRL_CACHE/images``, else ``~/.cache/jointrl/images``) chooses the cache.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "format_images", "run_images"]


def add_parser(sub: Any) -> None:
    """Add ``jointrl images ls|rm`` to ``jointrl``'s subparsers."""
    p = sub.add_parser(
        "images",
        help="list or remove cached Harbor task images",
        description="List (ls) or remove (rm) the Harbor task images built on this node.",
    )
    p.add_argument("action", choices=("ls", "rm"), help="ls: list; rm: remove")
    p.add_argument("digests", nargs="*", help="rm: digests (or their first 6+ characters) to remove")
    p.add_argument("--all", action="store_true", help="rm: every cached image")
    p.add_argument("--prefixes", action="store_true", help="rm: also the cached build prefixes (base trees)")
    p.add_argument(
        "--cache",
        default=None,
        help="the image cache (default: $JOINTRL_IMAGE_CACHE, else $JOINTRL_CACHE/images, else ~/.cache/jointrl/images)",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(run=run_images)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def format_images(images: list[dict], cache: Path) -> str:
    """The ``ls`` table: one row per image, newest first, and the cache's path."""
    if not images:
        return f"no images in {cache}"
    rows = [("DIGEST", "OWN SIZE", "BUILD", "CREATED", "BASE", "TASK")]
    for m in images:
        created = datetime.datetime.fromtimestamp(m.get("created", 0)).strftime("%Y-%m-%d %H:%M")
        base = m.get("base", "") + (" (approximate)" if m.get("approximate") else "")
        tasks = ",".join(m.get("tasks", []))
        rows.append(
            (m["digest"][:12], _size(m.get("size_bytes", 0)), f"{m.get('build_s', 0):.1f} s", created, base, tasks)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines) + f"\n{len(images)} image(s) in {cache}"


def run_images(args: argparse.Namespace) -> int:
    from envs.harbor.image import default_cache_dir, list_images, remove_image, remove_prefixes

    cache = Path(args.cache) if args.cache else default_cache_dir()
    if args.action == "ls":
        if args.digests or args.all or args.prefixes:
            print("jointrl: error: `images ls` takes no digests, --all or --prefixes", file=sys.stderr)
            return 2
        print(format_images(list_images(cache), cache))
        return 0
    if not (args.digests or args.all or args.prefixes):
        print("jointrl: error: `images rm` needs digests, --all or --prefixes", file=sys.stderr)
        return 2
    wanted = [m["digest"] for m in list_images(cache)] if args.all else args.digests
    for d in wanted:
        try:
            gone = remove_image(d, cache)
        except ValueError as exc:
            print(f"jointrl: error: {d}: {exc}", file=sys.stderr)
            return 2
        if not gone:
            print(f"jointrl: error: no image {d} in {cache}", file=sys.stderr)
            return 2
        print("\n".join(f"removed {g}" for g in gone))
    if args.prefixes:
        print(f"removed {remove_prefixes(cache)} build prefix(es)")
    return 0
