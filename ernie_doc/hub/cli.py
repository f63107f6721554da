"""`ernie-doc download`: fill the cache ahead of time (for a machine that later goes offline).

Then copy $ERNIE_DOC_HOME (default ~/.cache/ernie_doc) to the offline machine and set
ERNIE_DOC_OFFLINE=1 there (docs/checkpoints.md). Errors print one line and exit with status 2.
"""
import argparse
import logging
import os
import sys
from typing import List, Optional

from ernie_doc import releases as registry
from ernie_doc.errors import ErnieDocError
from ernie_doc.hub import cache
from ernie_doc.hub.cache import resolve


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ernie-doc download",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"released names ({', '.join(registry.names())}) or http(s) URLs")
    p.add_argument("--source", default=None, choices=[*registry.SOURCES, "all"],
                   help="which copy of the weights (default $ERNIE_DOC_SOURCE, else official; "
                        "all: every released copy)")
    p.add_argument("--tokenizer-only", action="store_true", help="the tokenizer files only")
    p.add_argument("--list", action="store_true", help="list the released models and the cache")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p.parse_args(argv)


def _listing() -> str:
    lines = [f"cache: {cache.home()}"]
    for release in registry.RELEASES.values():
        lines.append(f"{release.name}: {release.description}")
        for source, remote in release.weights.items():
            entry = os.path.join(cache.home(), "models", release.name, source)
            state = "cached" if os.path.isfile(os.path.join(entry, cache.MANIFEST)) else "-"
            lines.append(f"  {source:<10} {state:<7} {remote.url}")
        entry = os.path.join(cache.home(), "tokenizers", release.name)
        state = "cached" if os.path.isfile(os.path.join(entry, cache.MANIFEST)) else "-"
        lines.append(f"  {'tokenizer':<10} {state:<7} "
                     f"{', '.join(sorted(release.tokenizer))}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    # what is fetched and verified, on stderr for this call only (a caller in-process keeps
    # its own logging configuration)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    hub_logger = logging.getLogger("ernie_doc.hub")
    level = hub_logger.level
    hub_logger.addHandler(handler)
    hub_logger.setLevel(logging.INFO)
    try:
        return _download(args)
    finally:
        hub_logger.removeHandler(handler)
        hub_logger.setLevel(level)


def _download(args: argparse.Namespace) -> int:
    if args.list:
        print(_listing())
        return 0
    if not args.names:
        print("error: name at least one released model or URL (or --list)", file=sys.stderr)
        return 2
    try:
        for name in args.names:
            if args.tokenizer_only:
                print(f"{name} tokenizer: {resolve(name, kind='tokenizer')}")
                continue
            release = registry.release(name)
            sources = [args.source]
            if args.source == "all":
                sources = sorted(release.weights) if release else [None]
            for source in sources:
                path = resolve(name, source=source)
                print(f"{name}{f' ({source})' if source else ''}: {path}")
    except (ErnieDocError, OSError) as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
