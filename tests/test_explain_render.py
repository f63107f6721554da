"""The picture and the page of one explanation (ernie_doc/explain/render.py): file names that
stay in their directory, a PNG whose two readings are told apart (read back pixel by pixel),
written atomically; one self-contained HTML page whose colours follow the scores, whose text
comes back whole, and in which nothing of the document runs."""
import copy
import html
import os
import re
import sys

import numpy as np
import pytest

from ernie_doc.errors import ErnieDocError, MissingDependency
from ernie_doc.explain.render import (LEVELS, NEEDS_MATPLOTLIB, field_html, figure_names, page_html,
                                      render_html, render_png, shade_rgb)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# render.py's colours, as the PNG's pixels hold them
RED, BLUE = (220, 50, 47), (38, 110, 220)
SKIM, RETRO = (129, 114, 179), (42, 157, 143)
HOSTILE = '</span><script>alert(1)</script><img src=x onerror="alert(2)">'


def _record(n=3, readings=("skim", "retrospective"), split=True, scores=None, text=None,
            doc_id="7"):
    """An explanation record of `n` segments (windows of 10 characters, stride 6: they
    overlap) over a text of words, each word a token scored by a seeded generator."""
    rng = np.random.default_rng(n)
    text = text if text is not None else " ".join(f"w{i}" for i in range(4 * n))
    seg_scores = rng.normal(size=n) if scores is None else np.asarray(scores, dtype=float)
    segments = []
    for i, score in enumerate(seg_scores.tolist()):
        by = [score * 0.25, score * 0.75] if len(readings) == 2 else [score]
        segments.append({"segment": i, "field": "text", "chars": [6 * i, 6 * i + 10],
                         "tokens": [2 * i, 2 * i + 3], "score": score,
                         "by_reading": by if split else None})
    spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    token_scores = [[s, e, float(v)] for (s, e), v in zip(spans, rng.normal(size=len(spans)))]
    if scores is not None and not np.any(scores):
        token_scores = [[s, e, 0.0] for s, e, _ in token_scores]
    return {"doc_id": doc_id, "index": 0, "kind": "classification", "method": "gradient",
            "target": {"name": "label 'pos'", "score": 0.93},
            "prediction": {"pred": "pos", "probs": [0.07, 0.93]}, "readings": list(readings),
            "segments": segments,
            "top_tokens": [{"field": "text", "start": s, "end": e, "text": text[s:e],
                            "score": v} for s, e, v in token_scores[:3]],
            "token_scores": {"text": token_scores}, "texts": {"text": text}}


# -- file names ---------------------------------------------------------------------------------
@pytest.mark.parametrize("index,doc_id,stem", [
    (7, "7", "00007-7"),
    (0, "../../etc/passwd", "00000-___.._etc_passwd"),
    (1, "", "00001-doc"),
    (2, "a/b", "00002-a_b"),
    (3, "..", "00003-__"),
    (4, ".hidden", "00004-_hidden"),
    (5, "文档 é", "00005-____"),
    (6, "x" * 500, "00006-" + "x" * 60),
    (123456, "a\\b\x00c", "123456-a_b_c"),
])
def test_figure_names_stay_in_the_directory(index, doc_id, stem):
    assert figure_names(index, doc_id) == (stem + ".png", stem + ".html")
    for name in figure_names(index, doc_id):
        assert os.path.basename(name) == name and not name.startswith(".")
        assert re.fullmatch(r"[A-Za-z0-9._-]+", name)


def test_figure_names_sort_in_input_order_and_never_collide():
    names = [figure_names(i, d)[0] for i, d in enumerate(["b/x", "b_x", "a", "文", "字"])]
    assert names == sorted(names) and len(set(names)) == 5
    with pytest.raises(ValueError, match="index must be an int >= 0"):
        figure_names(-1, "x")


# -- the picture --------------------------------------------------------------------------------
def _pixels(path):
    """[H, W, 3] uint8 of a PNG, read back by PIL (or matplotlib without it)."""
    with open(path, "rb") as f:
        assert f.read(8) == PNG_MAGIC
    try:
        from PIL import Image
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"))
    except ImportError:
        import matplotlib.image
        return (matplotlib.image.imread(path)[..., :3] * 255).round().astype(np.uint8)


def _count(pixels, rgb):
    return int(np.all(pixels == np.asarray(rgb, dtype=np.uint8), axis=-1).sum())


def test_png_tells_the_two_readings_apart(tmp_path):
    record = _record(4, scores=[0.4, -0.2, 0.1, 0.3])
    before = copy.deepcopy(record)
    path = tmp_path / "a.png"
    render_png(record, str(path))
    pixels = _pixels(path)
    assert pixels.shape == (400, 548, 3)   # (5 + 0.12 * 4) x 4 inches at 100 dpi
    # both readings drawn, each in its colour; the single series' red / blue absent
    assert _count(pixels, SKIM) > 200 and _count(pixels, RETRO) > 600
    assert _count(pixels, RED) == 0 and _count(pixels, BLUE) == 0
    assert record == before   # read, never changed
    assert os.listdir(tmp_path) == ["a.png"]


@pytest.mark.parametrize("readings,split", [(("single",), True), (("skim", "retrospective"),
                                                                   False)])
def test_png_single_series_is_red_and_blue(tmp_path, readings, split):
    """One reading, or two readings the method does not split (occlusion): one bar per
    segment, red above 0, blue below."""
    render_png(_record(3, readings, split, scores=[0.5, -0.5, 0.25]), str(tmp_path / "b.png"))
    pixels = _pixels(tmp_path / "b.png")
    red, blue = _count(pixels, RED), _count(pixels, BLUE)
    assert red > 1000 and blue > 1000 and abs(red * 2 / 3 - blue) < 0.1 * blue   # 0.75 vs 0.5
    assert _count(pixels, SKIM) == 0 and _count(pixels, RETRO) == 0


def test_png_all_zero_many_segments_and_a_hostile_title(tmp_path):
    render_png(_record(5, scores=[0.0] * 5), str(tmp_path / "zero.png"))
    pixels = _pixels(tmp_path / "zero.png")
    assert _count(pixels, RED) == 0 and _count(pixels, BLUE) == 0
    assert 0 < _count(pixels, SKIM) < 250 and 0 < _count(pixels, RETRO) < 250   # the legend
    render_png(_record(5, ("single",), scores=[0.0] * 5), str(tmp_path / "zero1.png"))
    pixels = _pixels(tmp_path / "zero1.png")
    assert sum(_count(pixels, c) for c in (RED, BLUE, SKIM, RETRO)) == 0
    render_png(_record(300, ("single",)), str(tmp_path / "many.png"))
    assert _pixels(tmp_path / "many.png").shape == (400, 1600, 3)   # the width is capped
    # a doc_id matplotlib would read as (broken) mathtext is drawn as text
    render_png(_record(1, doc_id=r"$\frac{$ " + HOSTILE), str(tmp_path / "math.png"))
    assert _pixels(tmp_path / "math.png").shape == (400, 512, 3)
    # no segment at all (an empty document): an empty frame, no error
    render_png({"doc_id": "empty", "segments": [], "readings": ["single"]},
               str(tmp_path / "empty.png"))
    assert _pixels(tmp_path / "empty.png").shape == (400, 500, 3)
    # a lone surrogate (the font engine's TypeError) and a very long id: drawn, clipped
    render_png(_record(1, doc_id="x\udc80" * 5000), str(tmp_path / "odd.png"))
    assert _pixels(tmp_path / "odd.png").shape == (400, 512, 3)


def test_png_replaces_and_fails_whole(tmp_path, monkeypatch):
    path = tmp_path / "c.png"
    path.write_bytes(b"an older file")
    render_png(_record(2), str(path))
    first = path.read_bytes()
    assert first.startswith(PNG_MAGIC) and os.listdir(tmp_path) == ["c.png"]

    import matplotlib.figure

    def broken(self, fname, **kwargs):
        with open(fname, "wb") as f:
            f.write(PNG_MAGIC + b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", broken)
    with pytest.raises(OSError, match="No space left") as caught:
        render_png(_record(3), str(path))
    assert caught.value.filename == str(path)   # named as the file asked for, not the temp
    assert path.read_bytes() == first and os.listdir(tmp_path) == ["c.png"]
    with pytest.raises(OSError):
        render_png(_record(3), str(tmp_path / "new.png"))
    assert os.listdir(tmp_path) == ["c.png"]


def test_png_leaves_pyplot_and_the_backend_alone(tmp_path, monkeypatch):
    import matplotlib
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)   # importing it would fail

    def no_use(*args, **kwargs):
        raise AssertionError("matplotlib.use called")

    monkeypatch.setattr(matplotlib, "use", no_use)
    render_png(_record(2), str(tmp_path / "d.png"))
    assert _pixels(tmp_path / "d.png").shape[2] == 3


def test_png_without_matplotlib_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib fails
    with pytest.raises(MissingDependency) as caught:
        render_png(_record(2), str(tmp_path / "e.png"))
    assert str(caught.value) == NEEDS_MATPLOTLIB == \
        "the PNG needs matplotlib: pip install matplotlib (or --no-png)"
    assert isinstance(caught.value, ErnieDocError) and caught.value.exit_status == 2
    assert os.listdir(tmp_path) == []


# -- the page -----------------------------------------------------------------------------------
def _styles(page):
    """{css class: its background} of the page's shade classes."""
    return dict(re.findall(r"\.(m\d+|p\d+|z)\{background:(rgb\(\d+,\d+,\d+\))\}", page))


def _spans(page):
    """[(background, title, text)] of the page's token spans, in order."""
    styles = _styles(page)
    return [(styles[c], t, html.unescape(x)) for c, t, x in
            re.findall(r'<span class="(m\d+|p\d+|z)" title="([^"]*)">([^<]*)</span>', page)]


def _field_text(page, nth=0):
    """The text of the nth field's box, tags stripped and unescaped."""
    body = re.findall(r'<div class="text">(.*?)</div>', page, flags=re.S)[nth]
    return html.unescape(re.sub(r"<[^>]*>", "", body))


def test_colour_map_ends():
    assert shade_rgb(LEVELS) == "rgb(220,50,47)"
    assert shade_rgb(-LEVELS) == "rgb(38,110,220)"
    assert shade_rgb(0) == "rgb(255,255,255)"
    assert shade_rgb(LEVELS // 2) == "rgb(238,152,151)"   # half way to red
    reds = [int(shade_rgb(k)[4:-1].split(",")[1]) for k in range(LEVELS + 1)]
    assert reds == sorted(reds, reverse=True) and len(set(reds)) == LEVELS + 1


def test_page_colours_follow_the_scores():
    text = "up down flat half tiny"
    tokens = [[0, 2, 2.0], [3, 7, -2.0], [8, 12, 0.0], [13, 17, 1.0], [18, 22, 1e-9]]
    record = _record(1)
    record.update(texts={"text": text}, token_scores={"text": tokens})
    spans = _spans(page_html(record))
    assert spans == [("rgb(220,50,47)", "+2", "up"), ("rgb(38,110,220)", "-2", "down"),
                     ("rgb(255,255,255)", "+0", "flat"), (shade_rgb(LEVELS // 2), "+1", "half"),
                     ("rgb(255,255,255)", "+1e-09", "tiny")]
    # the scale is the largest |score|: a document of tiny scores is shaded all the same
    record["token_scores"] = {"text": [[s, e, v * 1e-9] for s, e, v in tokens]}
    assert [c for c, _, _ in _spans(page_html(record))][:4] == \
        ["rgb(220,50,47)", "rgb(38,110,220)", "rgb(255,255,255)", shade_rgb(LEVELS // 2)]
    # all zero: every token white, the legend's scale 0
    record["token_scores"] = {"text": [[s, e, 0.0] for s, e, _ in tokens]}
    page = page_html(record)
    assert {c for c, _, _ in _spans(page)} == {"rgb(255,255,255)"}
    assert "±0 (the largest |token score|)" in page


def test_page_text_comes_back_whole():
    text = "Ünïcode\n\n  indented\tline & <tag> \"q\" 'a'\r\nlast   "
    # overlapping, out of order, past the end, empty: the text is still shown whole and once
    tokens = [[0, 7, 0.5], [5, 12, -0.1], [30, 25, 0.2], [40, 99, 0.3], [13, 21, 0.0]]
    out = field_html(text, tokens, 0.5)
    assert html.unescape(re.sub(r"<[^>]*>", "", out)) == text
    assert [html.unescape(x) for x in re.findall(r'">([^<]*)</span>', out)] == \
        ["Ünïcode", "\n\n  i", "dented\tl", text[40:]]
    record = _record(2, text=text)
    record["texts"]["question"] = "Who? " + HOSTILE   # no token scores: shown plain
    page = page_html(record)
    assert _field_text(page, 0) == text and _field_text(page, 1) == "Who? " + HOSTILE
    assert "white-space:pre-wrap" in page and '<meta charset="utf-8">' in page


def test_page_is_self_contained(tmp_path):
    path = tmp_path / "p.html"
    path.write_text("older")
    record = _record(40)
    render_html(record, str(path))
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and os.listdir(tmp_path) == ["p.html"]
    for reference in ("http://", "https://", "//", "@import", "src=", "url(", "<script",
                      "<link", "<img", "<iframe", "<object"):
        assert reference not in page.lower(), reference
    # the segment table: 40 rows, a column per reading, the scores as the record holds them
    assert page.count("<tr><td>") - len(record["top_tokens"]) == 40
    assert "<th>skim (1st reading)</th><th>retrospective (2nd reading)</th>" in page
    assert f'{record["segments"][0]["score"]:+.4g}</td>' in page


def test_page_makes_a_hostile_document_inert():
    record = _record(2, text="before " + HOSTILE + " after", doc_id='7" onload="x' + HOSTILE)
    record["target"]["name"] = HOSTILE
    record["prediction"] = {"pred": HOSTILE}
    record["segments"][0]["field"] = HOSTILE
    page = page_html(record)
    assert "<script" not in page and "<img" not in page and 'onload="' not in page
    assert "onerror=\"" not in page
    assert _field_text(page) == record["texts"]["text"]
    # the hostile token's text sits escaped in its span
    assert any(x == '</span><script>alert(1)</script><img' for _, _, x in _spans(page))
    assert html.escape('7" onload="x', quote=True) in page


def test_page_of_an_empty_document():
    page = page_html({"doc_id": "e", "segments": [], "texts": {"text": ""},
                      "token_scores": {"text": []}})
    assert _field_text(page) == "" and "<h2>Segments</h2>" in page and "Top tokens" not in page


def test_page_with_a_lone_surrogate_is_written(tmp_path):
    """Not UTF-8 (a lone surrogate, which predict's inputs refuse): written as \\uXXXX."""
    render_html(_record(1, text="a \ud800 b", doc_id="x\udc80"), str(tmp_path / "s.html"))
    page = (tmp_path / "s.html").read_text(encoding="utf-8")
    assert _field_text(page) == "a \\ud800 b" and "<h1>document x\\udc80:" in page


def test_page_of_a_long_text_is_linear():
    def page(tokens):
        text = "abcd " * tokens   # 5 characters a token
        spans = [[5 * i, 5 * i + 4, v] for i, v in
                 enumerate(np.random.default_rng(0).normal(size=tokens).tolist())]
        record = _record(1)
        record.update(texts={"text": text}, token_scores={"text": spans})
        return page_html(record)

    small, big = page(20_000), page(40_000)
    assert big.count('<span class="') == 40_000 + 1   # every token, and the legend's bar
    growth = len(big) - len(small)
    assert 20_000 * 30 < growth < 20_000 * 50   # ~40 characters a token of 5, whatever n
    assert _field_text(big) == "abcd " * 40_000
