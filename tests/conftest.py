"""Shared test fixtures: repo on sys.path, seeded paddle, the ../shared folder when present."""
import zlib  # noqa: F401  before paddle: on 2.6.2 a later scipy/paddlenlp import fails otherwise
import os
import sys
from pathlib import Path

import json

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def shared_dir():
    """The shared reference folder (env ERNIE_DOC_SHARED, else ../shared beside the repo)."""
    return Path(os.environ.get("ERNIE_DOC_SHARED", ROOT.parent / "shared"))


def shared_path(*parts):
    """A path under ../shared, or skip the test with the reason."""
    path = shared_dir().joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not present (set ERNIE_DOC_SHARED to the shared folder)")
    return path


@pytest.fixture(autouse=True)
def _seed():
    import paddle
    paddle.seed(1234)
    np.random.seed(1234)
    yield


def tiny_config(**overrides):
    from ernie_doc import ErnieDocConfig
    values = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, vocab_size=60,
                  max_position_embeddings=16, memory_len=4)
    values.update(overrides)
    return ErnieDocConfig(**values)


def write(root, files):
    """Write {relative path: str, bytes or JSON-able object} under root; return root."""
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            path.write_text(json.dumps(content, ensure_ascii=False), encoding="utf-8")
    return root


def error(call, *parts):
    """Run call(); it must raise a one-line DataError containing every part."""
    from ernie_doc.data.document import DataError
    with pytest.raises(DataError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, (part, message)
    return message
