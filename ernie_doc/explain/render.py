"""The picture (render_png) and the self-contained page (render_html) of one explanation, drawn
from the JSON-able record `ernie-doc explain` writes for a document (read, never changed).
numpy and the standard library only; matplotlib is imported by render_png alone, never pyplot
(a user's chosen backend is left as it is)."""
import html
import json
import numbers
import re
import warnings
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ernie_doc.errors import MissingDependency
from ernie_doc.utils import atomic_path

# One diverging map for the page and the picture, as (r, g, b): +max, 0, -max.
RED, WHITE, BLUE = (220, 50, 47), (255, 255, 255), (38, 110, 220)
# shades per sign on the page: 2 * LEVELS + 1 CSS classes instead of one style per token
LEVELS = 10
SHADES = [f"m{-k}" if k < 0 else f"p{k}" if k > 0 else "z" for k in range(-LEVELS, LEVELS + 1)]
# the PNG's two readings (the page's table uses the same words)
READING_LABELS = {"skim": "skim (1st reading)", "retrospective": "retrospective (2nd reading)"}
READING_COLOURS = ("#8172b3", "#2a9d8f")
NEEDS_MATPLOTLIB = "the PNG needs matplotlib: pip install matplotlib (or --no-png)"
PREDICTION_CHARS = 400   # the page's header shows the prediction record up to this length
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def figure_names(index: int, doc_id: str) -> Tuple[str, str]:
    """The PNG and HTML names of the `index`-th document (0-based, input order) in the output
    directory: `00007-<safe>.png`, <safe> being `doc_id` reduced to [A-Za-z0-9._-] (no leading
    dot, at most 60 characters, `doc` when nothing is left): none leaves the directory or hides
    in it, and the index keeps them in input order and unique when two ids reduce alike."""
    if isinstance(index, bool) or not isinstance(index, numbers.Integral) or index < 0:
        raise ValueError(f"figure_names: index must be an int >= 0, not {index!r}")
    index = int(index)
    safe = _UNSAFE.sub("_", str(doc_id)[:60])
    dots = len(safe) - len(safe.lstrip("."))
    safe = ("_" * dots + safe[dots:]) or "doc"
    stem = f"{index:05d}-{safe}"
    return stem + ".png", stem + ".html"


# -- the colour map -----------------------------------------------------------------------------
def shade_rgb(level: int) -> str:
    """The CSS colour of a shade level in [-LEVELS, LEVELS]: linear from WHITE at 0 to RED at
    +LEVELS and BLUE at -LEVELS, e.g. 'rgb(220,50,47)' for +LEVELS."""
    end = RED if level > 0 else BLUE
    t = min(abs(level), LEVELS) / LEVELS
    r, g, b = (int(round(w + (e - w) * t)) for w, e in zip(WHITE, end))
    return f"rgb({r},{g},{b})"


def shade_levels(scores: np.ndarray, scale: float) -> np.ndarray:
    """[N] int shade levels in [-LEVELS, LEVELS] of `scores` [N] on the scale ±`scale` (the
    largest |score|); all 0 when the scale is 0."""
    scores = np.asarray(scores, dtype=np.float64)
    if not scale > 0:
        return np.zeros(scores.shape, dtype=np.int64)
    ratio = np.nan_to_num(scores / scale, nan=0.0, posinf=1.0, neginf=-1.0)
    return np.clip(np.rint(ratio * LEVELS), -LEVELS, LEVELS).astype(np.int64)


def _largest(values: np.ndarray) -> float:
    """max |value| over the finite values, 0.0 for none."""
    values = np.abs(np.asarray(values, dtype=np.float64))
    values = values[np.isfinite(values)]
    return float(values.max()) if values.size else 0.0


def _hex(rgb: Sequence[int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


# -- what the record holds ----------------------------------------------------------------------
# control characters other than tab, newline and carriage return have no place in HTML (a NUL
# makes tools read the page as binary): shown as U+FFFD
_CONTROLS = {c: "\ufffd" for c in range(32) if c not in (9, 10, 13)}
_CONTROLS[127] = "\ufffd"


def _esc(value: object) -> str:
    """`value` as HTML text: escaped, its control characters replaced (same length)."""
    return html.escape(str(value).translate(_CONTROLS), quote=True)


def _is_number(value: object) -> bool:
    """A real number (numpy's scalars too), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _number(value: object, digits: int = 4) -> str:
    """A score as the page and the title show it: signed, `digits` significant digits."""
    if _is_number(value):
        return f"{value:+.{digits}g}"
    return "–" if value is None else str(value)


def reading_split(record: dict) -> Tuple[List[str], Optional[np.ndarray]]:
    """(the labels of the record's readings, their per-segment scores [segments, readings]),
    or (labels, None) when any segment has no per-reading split (occlusion replaces a segment
    in both readings at once)."""
    readings = list(record.get("readings") or [])
    labels = [READING_LABELS.get(name, str(name)) for name in readings]
    splits = [s.get("by_reading") for s in record.get("segments") or []]
    if not splits or not readings or any(
            not isinstance(s, (list, tuple)) or len(s) != len(readings) for s in splits):
        return labels, None
    return labels, np.asarray(splits, dtype=np.float64).reshape(len(splits), len(readings))


def _target_line(record: dict, limit: int = 200) -> str:
    """'document 7: label 'pos' = +0.93 (occlusion)', unescaped; the id and the target's name
    clipped to `limit` characters each."""
    target = record.get("target") or {}
    doc_id, name = (v if len(v) <= limit else v[:limit - 1] + "…"
                    for v in (str(record.get("doc_id")), str(target.get("name"))))
    return (f"document {doc_id}: {name} = {_number(target.get('score'))} "
            f"({record.get('method')})")


# -- the picture --------------------------------------------------------------------------------
def _matplotlib():
    """(Figure, FigureCanvasAgg, MaxNLocator): the PNG alone needs matplotlib. Neither pyplot
    nor matplotlib.use: the Agg canvas is used directly, the user's backend is left alone."""
    try:
        import matplotlib  # noqa: F401  first: a package that is not there fails here
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as e:
        if (e.name or "matplotlib").split(".")[0] != "matplotlib":
            raise   # matplotlib is there but broken (one of its own dependencies): say which
        raise MissingDependency(NEEDS_MATPLOTLIB) from e
    return Figure, FigureCanvasAgg, MaxNLocator


def _plain(text: str) -> str:
    """`text` for a matplotlib label: its `$` escaped (no mathtext from a doc_id), a lone
    surrogate (which the font engine refuses) as \\uXXXX."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("$", r"\$")


def _draw_segments(ax, record: dict) -> None:
    """The bars on `ax`: per reading side by side (with the total as dots) when the record
    splits two readings, else one bar per segment in the page's red / blue."""
    segments = record.get("segments") or []
    x = np.arange(len(segments))
    totals = np.asarray([float(s.get("score") or 0.0) for s in segments], dtype=np.float64)
    labels, split = reading_split(record)
    if split is not None and split.shape[1] == 2:
        shown = [ax.bar(x + (k - 0.5) * 0.4, split[:, k], width=0.4, align="center",
                        color=READING_COLOURS[k], label=labels[k], linewidth=0)
                 for k in range(2)]
        shown += ax.plot(x, totals, linestyle="none", marker=".", color="black",
                         markersize=4 if len(segments) <= 60 else 2, label="total")
        ax.legend(handles=shown, fontsize=8, loc="best")
    else:
        colours = [_hex(RED) if v > 0 else _hex(BLUE) for v in totals]
        ax.bar(x, totals, width=0.8, color=colours, linewidth=0)
    if not np.any(totals) and (split is None or not np.any(split)):
        ax.text(0.5, 0.75, "every segment scores 0" if segments else "no segments",
                transform=ax.transAxes, ha="center", va="center", color="dimgray")
    ax.axhline(0.0, color="black", linewidth=0.6)
    if segments:
        ax.set_xlim(-0.7, len(segments) - 0.3)


def render_png(record: dict, path: str) -> None:
    """Write `path` atomically: the record's segment scores along the document (x: segment; y:
    attribution, positive raises the target score), the retrospective feed's two readings side by
    side when `by_reading` splits them. MissingDependency (one line) without matplotlib."""
    Figure, FigureCanvasAgg, MaxNLocator = _matplotlib()
    n = len(record.get("segments") or [])
    fig = Figure(figsize=(min(16.0, 5.0 + 0.12 * n), 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    _draw_segments(ax, record)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("segment (in document order)")
    ax.set_ylabel("attribution (+ raises the target score)")
    ax.set_title(_plain(_target_line(record, 40)), fontsize=10)
    save_figure(fig, path)


def save_figure(fig: Any, path: str) -> None:
    """Lay out a matplotlib Figure (an Agg canvas attached) and write it to `path` as a PNG,
    atomically: a temporary file beside `path`, then os.replace."""
    _, FigureCanvasAgg, _ = _matplotlib()
    if fig.canvas is None or not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    with warnings.catch_warnings():
        # a doc_id in a script the font lacks: boxes in the title, not a warning per glyph
        warnings.filterwarnings("ignore", message="Glyph .* missing from")
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png")


def new_figure(width: float, height: float) -> Any:
    """A matplotlib Figure on an Agg canvas (no pyplot); MissingDependency without
    matplotlib."""
    Figure, FigureCanvasAgg, _ = _matplotlib()
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


# -- the page -----------------------------------------------------------------------------------
_CSS = """body{font-family:sans-serif;margin:1.5em auto;max-width:60em;padding:0 1em;color:#222}
h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.5em}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ccc;padding:.15em .5em}
td.num{text-align:right;font-family:monospace}
.text{white-space:pre-wrap;overflow-wrap:anywhere;line-height:1.6;border:1px solid #ddd;
padding:.8em;font-family:serif}
.bar{display:inline-block;width:12em;height:1em;vertical-align:middle;border:1px solid #999;
background:linear-gradient(to right,%s,%s,%s)}
.plain{color:#555}
"""


def _style() -> str:
    """The page's CSS: the layout, the legend's gradient and one class per shade level."""
    shades = "\n".join(f".{name}{{background:{shade_rgb(level)}}}"
                       for name, level in zip(SHADES, range(-LEVELS, LEVELS + 1)))
    return _CSS % (shade_rgb(-LEVELS), shade_rgb(0), shade_rgb(LEVELS)) + shades


def _cell(value: object, scale: float) -> str:
    """A table cell holding a score, shaded on ±scale."""
    if not _is_number(value):
        return f'<td class="num">{_esc(_number(value))}</td>'
    level = int(shade_levels(np.asarray([value]), scale)[0])
    return f'<td class="num {SHADES[level + LEVELS]}">{_esc(_number(value))}</td>'


def _header_html(record: dict, token_scale: float, segment_scale: float) -> str:
    """The title line, the prediction (clipped) and the legend of the colour scale."""
    prediction = json.dumps(record.get("prediction"), ensure_ascii=False, default=str)
    if len(prediction) > PREDICTION_CHARS:
        prediction = prediction[:PREDICTION_CHARS - 1] + "…"
    target = record.get("target") or {}
    return (f"<h1>{_esc(_target_line(record))}</h1>\n"
            f"<p>kind: {_esc(record.get('kind'))} · method: {_esc(record.get('method'))} · "
            f"target: {_esc(target.get('name'))} · its score on the unchanged document: "
            f"{_esc(_number(target.get('score')))} · readings: "
            f"{_esc(', '.join(map(str, record.get('readings') or [])))}</p>\n"
            f"<p>prediction: <code>{_esc(prediction)}</code></p>\n"
            f'<p><span class="bar"></span> blue lowers the target score, white is 0, red '
            f"raises it. The text and the top tokens are shaded on "
            f"±{_esc(f'{token_scale:.4g}')} (the largest |token score|), the segment table "
            f"on ±{_esc(f'{segment_scale:.4g}')} (the largest |segment score|). Hover over a "
            f"word for its score.</p>\n")


def _segments_html(record: dict, scale: float) -> str:
    """The table of segments: field, characters, tokens, score and, when the method splits
    them, one column per reading."""
    labels, split = reading_split(record)
    names = labels if split is not None else []
    rows = ["<table><tr><th>segment</th><th>field</th><th>characters</th><th>tokens</th>"
            "<th>score</th>" + "".join(f"<th>{_esc(n)}</th>" for n in names) + "</tr>"]
    for i, seg in enumerate(record.get("segments") or []):
        chars, tokens = seg.get("chars") or ("", ""), seg.get("tokens") or ("", "")
        extra = "".join(_cell(float(v), scale) for v in split[i]) if split is not None else ""
        rows.append(f"<tr><td>{_esc(seg.get('segment', i))}</td><td>{_esc(seg.get('field'))}"
                    f"</td><td>{_esc(chars[0])}–{_esc(chars[-1])}</td><td>{_esc(tokens[0])}–"
                    f"{_esc(tokens[-1])}</td>{_cell(seg.get('score'), scale)}{extra}</tr>")
    return "<h2>Segments</h2>\n" + "\n".join(rows) + "</table>\n"


def _top_tokens_html(record: dict, scale: float) -> str:
    """The table of the top tokens: text, field, characters, score."""
    rows = [f"<tr><td>{_esc(t.get('text'))}</td><td>{_esc(t.get('field'))}</td><td>"
            f"{_esc(t.get('start'))}–{_esc(t.get('end'))}</td>{_cell(t.get('score'), scale)}</tr>"
            for t in record.get("top_tokens") or []]
    if not rows:
        return ""
    return ("<h2>Top tokens</h2>\n<table><tr><th>token</th><th>field</th><th>characters</th>"
            "<th>score</th></tr>\n" + "\n".join(rows) + "</table>\n")


def field_html(text: str, tokens: Sequence[Sequence[float]], scale: float) -> str:
    """`text` as HTML: each token [start_char, end_char, score] in a <span> shaded by its score
    on ±scale (its title: the score), the text between tokens as is, all of it escaped.
    Tokens are read in start order; one overlapping the previous starts at its end, offsets
    are clipped to the text, so the text comes back whole and once. tokens: [N, 3]."""
    arr = np.asarray(tokens, dtype=np.float64).reshape(-1, 3)
    arr = arr[np.argsort(arr[:, 0], kind="stable")]
    starts = np.clip(arr[:, 0], 0, len(text)).astype(np.int64)
    ends = np.clip(arr[:, 1], 0, len(text)).astype(np.int64)
    if len(ends):
        starts = np.maximum(starts, np.concatenate([[0], np.maximum.accumulate(ends)[:-1]]))
    keep = ends > starts
    levels = shade_levels(arr[keep, 2], scale) + LEVELS
    pieces, pos, escape = [], 0, _esc
    for start, end, level, score in zip(starts[keep].tolist(), ends[keep].tolist(),
                                        levels.tolist(), arr[keep, 2].tolist()):
        if start > pos:
            pieces.append(escape(text[pos:start]))
        pieces.append(f'<span class="{SHADES[level]}" title="{score:+.3g}">'
                      f"{escape(text[start:end])}</span>")
        pos = end
    pieces.append(escape(text[pos:]))
    return "".join(pieces)


def page_html(record: dict) -> str:
    """The whole page of one record (render_html writes it): header and legend, the segments,
    the top tokens, then each field's text, shaded where it has token scores, plain otherwise.
    One scale for every field (the largest |token score|): the fields compare."""
    token_scores = record.get("token_scores") or {}
    token_scale = max([_largest(np.asarray(t, dtype=np.float64).reshape(-1, 3)[:, 2])
                       for t in token_scores.values()] or [0.0])
    segment_scale = _largest([s.get("score") or 0.0 for s in record.get("segments") or []])
    _, split = reading_split(record)
    if split is not None:
        segment_scale = max(segment_scale, _largest(split))
    fields = []
    for name, text in (record.get("texts") or {}).items():
        text = str(text)
        body = (field_html(text, token_scores[name], token_scale) if name in token_scores
                else f'<span class="plain">{_esc(text)}</span>')
        fields.append(f'<h2>{_esc(name)}</h2>\n<div class="text">{body}</div>\n')
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{_esc(_target_line(record))}</title>\n<style>\n{_style()}\n</style>\n"
            "</head>\n<body>\n" + _header_html(record, token_scale, segment_scale)
            + _segments_html(record, segment_scale) + _top_tokens_html(record, token_scale)
            + "".join(fields) + "</body>\n</html>\n")


def render_html(record: dict, path: str) -> None:
    """Write `path` atomically: the record's page (page_html), UTF-8, with no script, font or image
    from anywhere. A lone surrogate (not UTF-8) is written as \\uXXXX."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(page_html(record))
