"""The language model's effective context (ernie_doc.predict.lm_context): the loss against the
test-time memory length (the run's protocol, the same predicted tokens for every length), a
model's own effective context, and Transformer-XL's RECL on hand-made curves with known
answers."""
import json
import math

import numpy as np
import pytest
from helpers import saved_lm, write_wikitext

from ernie_doc.errors import ConfigError, DataError
from ernie_doc.lm.data import Vocabulary
from ernie_doc.predict.lm import LMPipeline
from ernie_doc.predict.lm_context import (check_mem_lens, default_mem_lens, effective_context,
                                          measure_language_models, memory_curve, plot_memory_curves,
                                          recl, relative_gains)

TGT = 8


@pytest.fixture(scope="module")
def lms(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_context")
    text = write_wikitext(root / "wiki.test.tokens", 30, 0, words=30)
    vocab = Vocabulary.build([text])
    return {"text": text, **{r: saved_lm(root, r, r, vocab) for r in ("enhanced", "xl", "none")}}


def losses(curve):
    return {p["mem_len"]: p["loss"] for p in curve["points"]}


def test_recurrence_none_ignores_memory_enhanced_does_not(lms):
    """A `none` model reads the same loss at every memory length >= tgt_len and at 0, exactly
    (under same_length a shorter span would also cut its own segment); an enhanced model's
    differs; every length predicts the same tokens."""
    none = memory_curve(str(lms["none"]), str(lms["text"]), [0, TGT, 3 * TGT], max_tokens=300)
    assert len(set(losses(none).values())) == 1
    np.testing.assert_array_equal(none["token_nll"][0], none["token_nll"][3 * TGT])
    enhanced = memory_curve(str(lms["enhanced"]), str(lms["text"]), [3 * TGT, 0, TGT],
                            max_tokens=300)
    assert [p["mem_len"] for p in enhanced["points"]] == [0, TGT, 3 * TGT]
    loss = losses(enhanced)
    assert abs(loss[0] - loss[TGT]) > 1e-3 and abs(loss[TGT] - loss[3 * TGT]) > 1e-4
    # 300 tokens in 2 rows of 150: each row predicts all but its first token
    assert enhanced["rows"] == 2 and enhanced["tokens"] == 298
    assert enhanced["positions"].tolist() == list(range(1, 150)) + list(range(151, 300))
    assert all(v.shape == (298,) for v in enhanced["token_nll"].values())
    assert enhanced["protocol"] == {"tgt_len": TGT, "mem_len": 2 * TGT, "clamp_len": -1,
                                    "same_length": True, "ext_len": 0}
    assert loss[0] == pytest.approx(float(np.mean(enhanced["token_nll"][0], dtype=np.float64)))
    assert enhanced["points"][0]["ppl"] == pytest.approx(math.exp(loss[0]))


def test_the_run_protocol_length_equals_the_pipeline_reading(lms):
    """At the run's own eval memory length, one row over the whole file reads exactly what
    LMPipeline reads for the file as one document (the run's evaluation, tests/test_lm_predict)."""
    curve = memory_curve(str(lms["enhanced"]), str(lms["text"]), [2 * TGT], rows=1)
    pipe = LMPipeline.from_pretrained(str(lms["enhanced"]), batch_size=1)
    record = pipe([{"id": "t", "text": lms["text"].read_text(encoding="utf-8")}])[0]
    assert curve["tokens"] == record["tokens"]
    assert curve["points"][0]["loss"] == pytest.approx(record["nll"], rel=1e-6)
    np.testing.assert_allclose(curve["token_nll"][2 * TGT],
                               [-lp for _, lp in record["token_logprobs"]], rtol=1e-6)


def test_refusals_are_one_line_before_reading(lms, tmp_path):
    run, text = str(lms["enhanced"]), str(lms["text"])
    with pytest.raises(ConfigError, match=r"memory_curve mem_len 1000000000, eval_tgt_len 8.*"
                                          r"needs about"):
        memory_curve(run, text, [0, 10 ** 9])
    with pytest.raises(ConfigError, match="mem_lens: 4000000000: mem_len must be at most"):
        memory_curve(run, text, [4 * 10 ** 9])
    for bad, message in (([-1], "mem_lens: -1 is not"), ([], "at least one"),
                         (["8"], "mem_lens: '8' is not"), (8, "must be a list")):
        with pytest.raises(ConfigError, match=message):
            check_mem_lens(bad)
    with pytest.raises(ConfigError, match="max_tokens must be"):
        memory_curve(run, text, [0], max_tokens=1)
    with pytest.raises(DataError, match="3 tokens, too few for 2 rows"):
        memory_curve(run, text, [0], max_tokens=3)
    with pytest.raises(DataError, match="missing.tokens"):
        memory_curve(run, str(tmp_path / "missing.tokens"), [0])


def test_documented_comparison_runs(lms, tmp_path, monkeypatch, capsys):
    """docs/explain.md's block as written, on three saved models of one weights and the
    three recurrences: `none` gains nothing from memory (effective context and RECL 0)."""
    import readme_fixtures as rf
    block = rf.block_run_by("tests/test_lm_context.py::test_documented_comparison_runs")
    (tmp_path / "out").mkdir()
    for name in ("none", "xl", "enhanced"):
        (tmp_path / "out" / f"lm-{name}").symlink_to(lms[name])
    (tmp_path / "wiki.test.tokens").symlink_to(lms["text"])
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(block.code, "docs/explain.md", "exec"), scope)
    curves = scope["curves"]
    assert curves["none"]["effective_context"] == {"length": 0, "beyond_grid": False}
    assert len({p["loss"] for p in curves["none"]["points"]}) == 1
    assert all(curves[n]["tokens"] == curves["none"]["tokens"] for n in curves)
    assert recl(scope["token_nll"], 0.1)["none"]["recl"] == 0
    printed = capsys.readouterr().out
    assert printed.count("RECL r=") == 3 and "'none': 0" in printed


def test_a_group_is_measured_on_one_grid_and_tabled(lms, tmp_path):
    """measure_language_models: the default grid (0, 32, … up to 4× the run's eval memory 16,
    and 16 itself), the same tokens for every run, a JSON-able result, one table row per run,
    and a figure."""
    assert default_mem_lens({"mem_len": 16, "tgt_len": 8}) == [0, 16, 32, 64]
    assert default_mem_lens({"mem_len": 0, "tgt_len": 8}) == [0, 32]
    assert default_mem_lens({"mem_len": 64, "tgt_len": 64}) == list(range(0, 257, 32))
    runs = {name: str(lms[name]) for name in ("none", "xl", "enhanced")}
    found = measure_language_models(runs, str(lms["text"]), max_tokens=200)
    assert found["mem_lens"] == [0, 16, 32, 64]
    assert json.loads(json.dumps(found)) == found
    assert {r["tokens"] for r in found["runs"].values()} == {198}
    assert set(found["recl"]) == {"0.1", "0.5", "1.0"}
    assert found["recl"]["0.1"]["none"]["recl"] == 0
    lines = found["table"].splitlines()
    assert lines[0].startswith("| run | recurrence | tokens | ppl, no memory |")
    assert len(lines) == 5 and lines[2].startswith("| none | none | 198 |")
    none_ppl = found["runs"]["none"]["points"][0]["ppl"]
    assert f"| {none_ppl:.2f} | {none_ppl:.2f} (16) | {none_ppl:.2f} (0) | 0 | 0 | 0 | 0 |" \
        in lines[2]
    fig = plot_memory_curves(found)
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) == 3
    fig.savefig(tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- one model's effective context ----------------------------------------------------------------
def test_effective_context_is_where_longer_lengths_stop_helping():
    # 0 → 32: ppl −63 %; 32 → 64: −0.5 %, 32 → 96: −1.19 % (≥ 1 %); 64 → 96: −0.70 %
    assert effective_context({0: 5.0, 32: 4.0, 64: 3.995, 96: 3.988}) == \
        {"length": 64, "beyond_grid": False}
    assert effective_context({0: 5.0, 32: 4.0, 64: 3.995, 96: 3.988}, threshold=0.05) == \
        {"length": 32, "beyond_grid": False}
    # still improving at the longest length: a lower bound
    assert effective_context({0: 5.0, 32: 4.0, 64: 3.0}) == {"length": 64, "beyond_grid": True}
    # a longer memory that hurts does not count
    assert effective_context({0: 4.0, 32: 4.5}) == {"length": 0, "beyond_grid": False}


# -- RECL (Transformer-XL, Appendix C) --------------------------------------------------------
def test_recl_walks_the_grid_until_the_relative_gain_falls_below_one_percent():
    """One model, one token: g(c, c') = 1 − exp(l(c') − l(c)); the walk stops at the first
    step under 1 % even when a later one would gain again (the paper's algorithm)."""
    found = recl({"m": {0: 5.0, 32: 4.0, 64: 3.995, 96: 3.0}}, r=1.0)["m"]
    assert found["recl"] == 32 and found["beyond_grid"] is False
    assert [(g["from"], g["to"]) for g in found["gains"]] == [(0, 32), (32, 64)]
    assert found["gains"][0]["gain"] == pytest.approx(1 - math.exp(-1.0))
    assert found["gains"][1]["gain"] == pytest.approx(1 - math.exp(-0.005))
    assert recl({"m": {0: 5.0, 32: 4.0, 64: 3.9}}, r=1.0)["m"]["recl"] == 64
    assert recl({"m": {0: 5.0, 32: 4.0, 64: 3.9}}, r=1.0)["m"]["beyond_grid"] is True


def test_recl_baseline_is_the_group_best_at_the_shorter_length():
    """B improves on its own short context, but never below A's (the group's baseline): its
    relative gain is 0, its RECL the shortest length; alone it would extend."""
    a = {0: [2.0, 2.0], 10: [2.0, 2.0]}
    b = {0: [3.0, 3.0], 10: [2.5, 2.5]}
    group = recl({"A": a, "B": b}, r=1.0)
    assert group["A"]["recl"] == group["B"]["recl"] == 0
    assert group["B"]["gains"][0]["gain"] == 0.0
    assert recl({"B": b}, r=1.0)["B"]["recl"] == 10
    # losses worse than the baseline are clipped to it: a worse token costs nothing
    c = {0: [2.0, 2.0], 10: [1.0, 9.0]}
    assert relative_gains({"A": a, "C": c}, 0, 10, 1.0)["C"] == \
        pytest.approx(1 - math.exp(-0.5))


def test_recl_ratio_keeps_the_hardest_tokens():
    """Nine easy tokens and one hard one that longer context helps a little: with r = 0.1 the
    gain is that token's (exp −0.1: ≥ 1 %, the walk extends); with r = 1 it is diluted to
    1 − exp(−0.01) < 1 % and the walk stops."""
    short = [1.0] * 9 + [5.0]
    long = [1.0] * 9 + [4.9]
    curves = {"m": {0: short, 50: long}}
    assert relative_gains(curves, 0, 50, 0.1)["m"] == pytest.approx(1 - math.exp(-0.1))
    assert relative_gains(curves, 0, 50, 1.0)["m"] == pytest.approx(1 - math.exp(-0.01))
    assert recl(curves, r=0.1)["m"]["recl"] == 50
    assert recl(curves, r=1.0)["m"]["recl"] == 0


def test_recl_input_errors_name_the_model():
    with pytest.raises(ValueError, match="recl: B has context lengths"):
        recl({"A": {0: 1.0, 8: 1.0}, "B": {0: 1.0}})
    with pytest.raises(ValueError, match="recl: B at context 8 has 1 token losses, expected 2"):
        recl({"A": {0: [1.0, 1.0], 8: [1.0, 1.0]}, "B": {0: [1.0, 1.0], 8: [1.0]}})
    with pytest.raises(ValueError, match=r"r must be in \(0, 1\]"):
        recl({"A": {0: 1.0, 8: 1.0}}, r=0.0)
