"""The released ERNIE-Doc models: where their files live and what they must hash to.

Sources, as the official README (PaddlePaddle/ERNIE `ernie-doc/README.md`) and PaddleNLP 2.8.1
(`paddlenlp/transformers/ernie_doc/{modeling,tokenizer}.py`) publish them: "official" weights
(static LoDTensor files) for base-en, base-zh and large-en, and "paddlenlp" .pdparams for
base-en and base-zh. No checksum is published: the tokenizer files are pinned here by sha256,
and the weights are trusted on first use (`Remote.sha256` None) until a value is pinned."""
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from ernie_doc.errors import HubError

SOURCES = ("official", "paddlenlp")
DEFAULT_SOURCE = "official"

_OFFICIAL = "https://ernie-github.cdn.bcebos.com"
_PADDLENLP = "https://bj.bcebos.com/paddlenlp/models/transformers"


@dataclass(frozen=True)
class Remote:
    """One file to fetch: URL, sha256 (hex) when known, and the most bytes its body may hold
    (None: ERNIE_DOC_DOWNLOAD_MAX_BYTES, else 8 GiB)."""
    url: str
    sha256: Optional[str] = None
    max_bytes: Optional[int] = None


@dataclass(frozen=True)
class Release:
    """A released model: its config (a PRESETS name or a dict), its weights per source (an
    official archive or a PaddleNLP .pdparams) and its tokenizer files ({name: Remote})."""
    name: str
    preset: str
    weights: Dict[str, Remote]
    tokenizer: Dict[str, Remote]
    description: str = ""

    def weights_for(self, source: str) -> Remote:
        """The weights of `source`; ValueError naming the sources this release has."""
        if source not in SOURCES:
            raise HubError(f"source {source!r}: choose one of {', '.join(SOURCES)}")
        if source not in self.weights:
            have = ", ".join(sorted(self.weights))
            raise HubError(f"{self.name}: no {source!r} copy of the weights was released "
                           f"(sources: {have})")
        return self.weights[source]


# Caps on a body (the files are about 1 MB, 0.5 GB and 1.6 GB)
_TOKENIZER_CAP = 64 << 20
_BASE_CAP = 2 << 30
_LARGE_CAP = 5 << 30

_BASE_EN_TOKENIZER = {
    "vocab.txt": Remote(f"{_PADDLENLP}/ernie-doc-base-en/vocab.txt",
                        "63b7e28c9cd3a0d9d13fd03f00899058b25a47af9d1e379162b1a2608c1236f7",
                        _TOKENIZER_CAP),
    "encoder.json": Remote(f"{_PADDLENLP}/ernie-doc-base-en/encoder.json",
                           "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
                           _TOKENIZER_CAP),
    "vocab.bpe": Remote(f"{_PADDLENLP}/ernie-doc-base-en/vocab.bpe",
                        "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
                        _TOKENIZER_CAP),
}
_BASE_ZH_TOKENIZER = {
    "vocab.txt": Remote(f"{_PADDLENLP}/ernie-doc-base-zh/vocab.txt",
                        "fdd969002e54cde4b20bd20d0871905017f1d07b9a21ee5d0d561a1d6a949061",
                        _TOKENIZER_CAP),
}

RELEASES: Dict[str, Release] = {}


def register(release: Release) -> Release:
    """Add (or replace) a release by name; returns it. For an internal model served the same
    way, and for tests."""
    RELEASES[release.name] = release
    return release


def unregister(name: str) -> None:
    RELEASES.pop(name, None)


register(Release(
    "ernie-doc-base-en", "ernie-doc-base-en",
    weights={"official": Remote(f"{_OFFICIAL}/model-ernie-doc-base-en.tar.gz",
                                max_bytes=_BASE_CAP),
             "paddlenlp": Remote(f"{_PADDLENLP}/ernie-doc-base-en/ernie-doc-base-en.pdparams",
                                 max_bytes=_BASE_CAP)},
    tokenizer=_BASE_EN_TOKENIZER,
    description="English, 12 layers, hidden 768, 12 heads; byte-level BPE (50,265 tokens)"))
register(Release(
    "ernie-doc-base-zh", "ernie-doc-base-zh",
    weights={"official": Remote(f"{_OFFICIAL}/model-ernie-doc-base-zh.tar.gz",
                                max_bytes=_BASE_CAP),
             "paddlenlp": Remote(f"{_PADDLENLP}/ernie-doc-base-zh/ernie-doc-base-zh.pdparams",
                                 max_bytes=_BASE_CAP)},
    tokenizer=_BASE_ZH_TOKENIZER,
    description="Chinese, 12 layers, hidden 768, 12 heads; WordPiece (28,000 tokens)"))
register(Release(
    "ernie-doc-large-en", "ernie-doc-large-en",
    weights={"official": Remote(f"{_OFFICIAL}/model-ernie-doc-large-en.tar.gz",
                                max_bytes=_LARGE_CAP)},
    tokenizer=_BASE_EN_TOKENIZER,
    description="English, 24 layers, hidden 1024, 16 heads; the base-en BPE files"))


def release(name: str) -> Optional[Release]:
    """The release called `name`, or None."""
    return RELEASES.get(name)


def names() -> Tuple[str, ...]:
    return tuple(RELEASES)
