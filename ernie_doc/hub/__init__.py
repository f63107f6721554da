"""Released models by name: fetch, cache and verify checkpoints and tokenizers.

    from ernie_doc.hub import resolve
    resolve("ernie-doc-base-en")   # → ~/.cache/ernie_doc/models/ernie-doc-base-en/official

`from_pretrained`, `load_tokenizer`, the run-config keys `model`, `init_checkpoint` and
`tokenizer`, and every tool resolve their paths here. See ernie_doc.hub.cache for the cache
layout and rules, ernie_doc.releases for the released names."""
from ernie_doc.hub.cache import (default_source, download_path, home, is_released, is_url, resolve,
                                 verify_entry)
from ernie_doc.hub.fetch import mirrored, offline
from ernie_doc.releases import RELEASES, SOURCES, Release, Remote, register, unregister

__all__ = ["RELEASES", "SOURCES", "Release", "Remote", "default_source",
           "download_path", "home", "is_released", "is_url", "mirrored", "offline", "register",
           "resolve", "unregister", "verify_entry"]
