"""Export + paddle.inference Predictor (oneDNN on) against dygraph, carrying memories."""
import importlib.util
import json
import os

import numpy as np
import paddle
import pytest
from helpers import ROOT, tiny_config

from ernie_doc import ErnieDocModel
from ernie_doc.errors import PredictorInputError
from ernie_doc.heads import ErnieDocForSequenceClassification
from ernie_doc.predict.engine import Predictor
from ernie_doc.predict.export import export

SEQ_LEN = 8
BATCH = 3
TOL = 1e-5


def _segments(config, n=3, seed=0):
    """n segments (dicts of numpy arrays) of B=3 rows: segment 1 has non-uniform task ids,
    segment 2 resets row 0's memory, the last one is padded (tail and before a final token)."""
    rng = np.random.RandomState(seed)
    segs = []
    for s in range(n):
        ids = rng.randint(4, config.vocab_size, (BATCH, SEQ_LEN)).astype("int64")
        mask = np.ones((BATCH, SEQ_LEN), "float32")
        types = np.zeros((BATCH, SEQ_LEN), "int64")
        reset = np.zeros([BATCH], bool)
        if s == 1:
            types = rng.randint(0, config.task_type_vocab_size, (BATCH, SEQ_LEN)).astype("int64")
        if s == 2:
            reset[0] = True
            types[:, SEQ_LEN // 2:] = 1
        if s == n - 1:
            mask[1, SEQ_LEN // 2:] = 0
            mask[2, 3:-1] = 0
            ids[mask == 0] = config.pad_token_id
        segs.append(dict(input_ids=ids, attention_mask=mask, token_type_ids=types,
                         reset_memory=reset))
    return segs


def _dygraph(model, segs):
    """The eager model over the segments, carrying memories: list of dicts of numpy arrays."""
    outs, mem = [], None
    with paddle.no_grad():
        for seg in segs:
            out = model(paddle.to_tensor(seg["input_ids"]), mem,
                        paddle.to_tensor(seg["token_type_ids"]),
                        paddle.to_tensor(seg["attention_mask"]),
                        paddle.to_tensor(seg["reset_memory"]))
            enc = out.encoder if hasattr(out, "encoder") else out
            mem = out.memories
            res = {"memories": mem.numpy()}
            if hasattr(out, "logits"):
                res["logits"] = out.logits.numpy()
            else:
                res.update(sequence_output=enc.sequence_output.numpy(),
                           pooled_output=enc.pooled_output.numpy())
            outs.append(res)
    return outs


def _assert_close(got, want):
    for i, (g, w) in enumerate(zip(got, want)):
        assert set(w) <= set(g), (sorted(g), sorted(w))
        for name in w:
            diff = float(np.abs(g[name].astype("float64") - w[name]).max())
            assert diff <= TOL, f"segment {i} {name}: max abs diff {diff}"


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """(model, Predictor) for the bare encoder exported with a dynamic batch."""
    paddle.seed(7)
    model = ErnieDocModel(tiny_config())
    model.eval()
    prefix = str(tmp_path_factory.mktemp("bare") / "ernie_doc")
    info = export(model, prefix, seq_len=SEQ_LEN)
    return model, Predictor(prefix, threads=1), info


def test_files_and_sidecar(bare):
    _, _, info = bare
    suffix = ".json" if int(paddle.__version__.split(".")[0]) >= 3 else ".pdmodel"
    assert info["model_path"].endswith(suffix) and os.path.isfile(info["model_path"])
    assert os.path.isfile(info["params_path"])
    meta = json.load(open(info["meta_path"]))
    assert meta["seq_len"] == SEQ_LEN and meta["batch_size"] is None
    assert meta["memory_shape"] == [2, -1, 4, 32]
    assert [i["name"] for i in meta["inputs"]] == [
        "input_ids", "memories", "token_type_ids", "attention_mask", "reset_memory"]
    assert [o["name"] for o in meta["outputs"]] == [
        "sequence_output", "pooled_output", "memories"]
    assert meta["config"]["hidden_size"] == 32
    assert not [f for f in os.listdir(os.path.dirname(info["meta_path"])) if f.startswith(".")]


def test_bare_stream_matches_dygraph(bare):
    model, pred, _ = bare
    segs = _segments(model.config)
    want = _dygraph(model, segs)
    got = pred.stream(segs)
    _assert_close(got, want)
    # oneDNN must be deterministic run to run (3.3.1 is not for some matmul shapes).
    again = pred.stream(segs)
    for a, b in zip(got, again):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    # The reset row starts over: the same as a fresh document from that segment.
    fresh = pred.run(segs[2]["input_ids"][:1], segs[2]["attention_mask"][:1],
                     segs[2]["token_type_ids"][:1])
    assert np.abs(fresh["sequence_output"] - got[2]["sequence_output"][:1]).max() <= TOL


def test_dynamic_batch_and_explicit_state(bare):
    model, pred, _ = bare
    segs = _segments(model.config)
    want = _dygraph(model, [{k: v[:2] for k, v in s.items()} for s in segs[:2]])
    out = pred.run(**{k: v[:2] for k, v in segs[0].items()})
    out2 = pred.run(memories=out["memories"], **{k: v[:2] for k, v in segs[1].items()})
    _assert_close([out, out2], want)


def test_head_matches_dygraph(tmp_path):
    paddle.seed(11)
    model = ErnieDocForSequenceClassification(tiny_config(), num_labels=3)
    model.eval()
    export(model, str(tmp_path / "cls"), seq_len=SEQ_LEN, batch_size=BATCH)
    pred = Predictor(str(tmp_path), threads=2)
    segs = _segments(model.config, seed=1)
    got = pred.stream(segs)
    assert got[0]["logits"].shape == (BATCH, 3)
    _assert_close(got, _dygraph(model, segs))


def test_wrong_inputs_raise_clear_errors(bare):
    model, pred, _ = bare
    ids = np.zeros((2, SEQ_LEN), "int64")
    with pytest.raises(PredictorInputError, match=r"input_ids must have shape \[batch, 8\]"):
        pred.run(np.zeros((2, SEQ_LEN + 1), "int64"))
    with pytest.raises(PredictorInputError, match=r"memories must have shape \[2, 2, 4, 32\]"):
        pred.run(ids, memories=np.zeros((2, 3, 4, 32), "float32"))
    with pytest.raises(PredictorInputError, match=r"attention_mask must have shape \[2, 8\]"):
        pred.run(ids, attention_mask=np.ones((2, 4)))
    with pytest.raises(PredictorInputError, match="input_ids must be an integer array"):
        pred.run(ids.astype("float32"))
    with pytest.raises(PredictorInputError, match="memories must be a floating array"):
        pred.run(ids, memories=np.zeros((2, 2, 4, 32), "int64"))
    with pytest.raises(PredictorInputError, match=r"input_ids values must be in \[0, 60\)"):
        pred.run(ids + 60)
    with pytest.raises(PredictorInputError, match=r"segment 1: reset_memory must have shape"):
        pred.stream([ids, {"input_ids": ids, "reset_memory": np.zeros(3, bool)}])


def test_export_tool_and_fixed_batch(tmp_path):
    spec = importlib.util.spec_from_file_location("export_model",
                                                  ROOT / "tools" / "export_model.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    cfg = tmp_path / "tiny.json"
    tiny_config().to_json(cfg)
    assert tool.main(["--config", str(cfg), "--output", str(tmp_path / "out" / "mc"),
                      "--head", "multiple_choice", "--num-choices", "2",
                      "--batch-size", "4", "--seq-len", str(SEQ_LEN)]) == 0
    pred = Predictor(str(tmp_path / "out" / "mc"))
    out = pred.run(np.ones((4, SEQ_LEN), "int64"))
    assert out["logits"].shape == (2, 2) and out["memories"].shape == (2, 4, 4, 32)
    with pytest.raises(PredictorInputError, match=r"batch fixed at export"):
        pred.run(np.ones((2, SEQ_LEN), "int64"))


def test_export_tool_from_checkpoint_dir(tmp_path):
    spec = importlib.util.spec_from_file_location("export_model",
                                                  ROOT / "tools" / "export_model.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    from ernie_doc.heads import ErnieDocForSequenceClassification
    model = ErnieDocForSequenceClassification(tiny_config(), num_labels=3)
    model.eval()
    model.save_pretrained(tmp_path / "ckpt", format="official")
    assert tool.main(["--config", str(tmp_path / "ckpt"), "--output", str(tmp_path / "clf"),
                      "--head", "sequence_classification", "--seq-len", str(SEQ_LEN)]) == 0
    ids = np.arange(2 * SEQ_LEN).reshape(2, SEQ_LEN) % 60
    got = Predictor(str(tmp_path / "clf")).run(ids)["logits"]
    with paddle.no_grad():
        want = model(paddle.to_tensor(ids)).logits.numpy()
    assert got.shape == (2, 3) and np.abs(got - want).max() <= TOL


def test_mask_empty_memory_export(tmp_path):
    paddle.seed(3)
    model = ErnieDocModel(tiny_config(mask_empty_memory=True))
    model.eval()
    export(model, str(tmp_path / "m"), seq_len=SEQ_LEN)
    pred = Predictor(str(tmp_path / "m"))
    segs = _segments(model.config)
    got = pred.stream(segs)
    mem = mask = None
    with paddle.no_grad():
        for seg, g in zip(segs, got):
            out = model(paddle.to_tensor(seg["input_ids"]), mem,
                        paddle.to_tensor(seg["token_type_ids"]),
                        paddle.to_tensor(seg["attention_mask"]),
                        paddle.to_tensor(seg["reset_memory"]), mask)
            mem, mask = out.memories, out.memory_mask
            for name, want in (("sequence_output", out.sequence_output),
                               ("memories", mem), ("memory_mask", mask)):
                assert np.abs(g[name] - want.numpy()).max() <= TOL, name


# -- heads of the registry beyond classification: pair matching, HotpotQA ---------------------
def _rows(config, rows, n=2, seed=5):
    """n segments of `rows` rows (dicts of numpy arrays), the second resetting row 0."""
    rng = np.random.RandomState(seed)
    return [dict(input_ids=rng.randint(4, config.vocab_size, (rows, SEQ_LEN)).astype("int64"),
                 attention_mask=np.ones((rows, SEQ_LEN), "float32"),
                 token_type_ids=np.zeros((rows, SEQ_LEN), "int64"),
                 reset_memory=np.arange(rows) == 0 if s else np.zeros([rows], bool))
            for s in range(n)]


def _dygraph_fields(model, segs, fields):
    """The eager model over the segments: [{field: array}] for the named output fields."""
    outs, mem = [], None
    with paddle.no_grad():
        for seg in segs:
            out = model(*(paddle.to_tensor(seg[k]) if k != "memories" else mem
                          for k in ("input_ids", "memories", "token_type_ids",
                                    "attention_mask", "reset_memory")))
            mem = out.memories
            outs.append(dict({f: getattr(out, f).numpy() for f in fields},
                             memories=mem.numpy()))
    return outs


def _convert_then_export(tmp_path, model, head, *export_args):
    """model → ours → `ernie-doc convert` to PaddleNLP's layout (the class read from the
    checkpoint) → `ernie-doc export` of that directory: the Predictor."""
    from ernie_doc.cli import convert
    from ernie_doc.cli import export as export_cli
    model.save_pretrained(tmp_path / "ours")
    assert convert.main([str(tmp_path / "ours"), str(tmp_path / "pn"), "--to", "paddlenlp",
                         "--quiet"]) == 0
    assert export_cli.main(["--config", str(tmp_path / "pn"), "--output",
                            str(tmp_path / "exp" / head), "--head", head,
                            "--seq-len", str(SEQ_LEN), *export_args]) == 0
    return Predictor(str(tmp_path / "exp" / head))


def test_pair_matching_convert_export_round_trip(tmp_path):
    from ernie_doc import auto
    from ernie_doc.errors import ExportError
    from ernie_doc.heads import ErnieDocForPairMatching
    paddle.seed(21)
    model = ErnieDocForPairMatching(tiny_config())
    model.eval()
    assert auto.head_class("pair_matching") is ErnieDocForPairMatching
    pred = _convert_then_export(tmp_path, model, "pair_matching")
    assert pred.meta["model_class"] == "ErnieDocForPairMatching"
    assert pred.meta["rows_per_example"] == 2
    assert [o["name"] for o in pred.meta["outputs"]] == ["logits", "memories"]
    segs = _rows(model.config, 4)
    got = pred.stream(segs)
    assert got[0]["logits"].shape == (2,)   # one logit per (A,B) / (A,C) pair of rows
    _assert_close(got, _dygraph_fields(model, segs, ["logits"]))
    with pytest.raises(PredictorInputError, match=r"input_ids rows \(3\) must be a multiple "
                                                   r"of 2"):
        pred.run(np.ones((3, SEQ_LEN), "int64"))
    with pytest.raises(ExportError, match=r"pair matching: batch_size \(3\) must come in "
                                          r"pairs"):
        export(model, str(tmp_path / "odd"), seq_len=SEQ_LEN, batch_size=3)


@pytest.mark.parametrize("stage", ["evidence", "answer"])
def test_hotpotqa_convert_export_round_trip(tmp_path, stage):
    from ernie_doc import auto
    from tasks.hotpotqa.head import ErnieDocForHotpotQA
    paddle.seed(23)
    model = ErnieDocForHotpotQA(tiny_config(), stage=stage)
    model.eval()
    assert auto.head_class("hotpotqa") is ErnieDocForHotpotQA
    # The stage travels with the checkpoint: no argument says it on the way.
    pred = _convert_then_export(tmp_path, model, "hotpotqa", "--batch-size", "2")
    fields = ["para_logits", "sent_logits"] + (["type_logits", "span_logits"]
                                               if stage == "answer" else [])
    assert [o["name"] for o in pred.meta["outputs"]] == fields + ["memories"]
    segs = _rows(model.config, 2)
    got = pred.stream(segs)
    assert got[0]["para_logits"].shape == (2, SEQ_LEN)
    if stage == "answer":
        assert got[0]["type_logits"].shape == (2, 3)
        assert got[0]["span_logits"].shape == (2, SEQ_LEN, 2)
    _assert_close(got, _dygraph_fields(model, segs, fields))


def test_export_refuses_heads_that_cannot_export(tmp_path):
    from ernie_doc import auto
    from ernie_doc.errors import ExportError
    from ernie_doc.heads import ErnieDocForPretraining
    assert set(auto.head_names(exportable=True)) == set(auto.head_names()) - {"pretraining"}
    with pytest.raises(ExportError, match="cannot export ErnieDocForPretraining: expected "
                                          "ErnieDocModel or one of .*ErnieDocForKeyphrase"):
        export(ErnieDocForPretraining(tiny_config()), str(tmp_path / "x"), seq_len=SEQ_LEN)


# -- a head with an input of its own: OpenKP's word_index ------------------------------------
def _keyphrase_segments(config, rows, n=3, seed=13):
    """n segments of `rows` rows with word_index [rows, T]: increasing word starts, 0 after the
    last word (as KeyphraseSegmenter lays them out); the last segment resets row 0."""
    segs = _rows(config, rows, n, seed)
    rng = np.random.RandomState(seed)
    for seg in segs:
        index = np.zeros((rows, SEQ_LEN), "int64")
        for r in range(rows):
            starts = np.sort(rng.choice(np.arange(1, SEQ_LEN), rng.randint(1, SEQ_LEN),
                                        replace=False))
            index[r, :len(starts)] = starts
        seg["word_index"] = index
    return segs


@pytest.mark.parametrize("mask_empty_memory", [False, True])
def test_keyphrase_head_exports_with_word_index(tmp_path, mask_empty_memory):
    """OpenKP's head declares word_index [B,T] int64 (Head.export_inputs): the export takes it
    last, the sidecar lists it, Predictor.run needs it and matches dygraph to 1e-5."""
    from tasks.openkp.head import ErnieDocForKeyphrase
    paddle.seed(31)
    model = ErnieDocForKeyphrase(tiny_config(mask_empty_memory=mask_empty_memory))
    model.eval()
    info = export(model, str(tmp_path / "kp"), seq_len=SEQ_LEN)
    assert info["inputs"][-1] == {"name": "word_index", "shape": [-1, SEQ_LEN],
                                  "dtype": "int64"}
    assert info["head_inputs"]["word_index"]["high"] == SEQ_LEN
    assert [o["name"] for o in info["outputs"]][:2] == ["logits", "memories"]
    pred = Predictor(str(tmp_path / "kp"))
    assert pred.head_inputs.keys() == {"word_index"}
    segs = _keyphrase_segments(model.config, 2)
    got = pred.stream(segs)
    assert got[0]["logits"].shape == (2, SEQ_LEN, 5)
    outs, mem, mask = [], None, None
    with paddle.no_grad():
        for seg in segs:
            out = model(paddle.to_tensor(seg["input_ids"]), mem,
                        paddle.to_tensor(seg["token_type_ids"]),
                        paddle.to_tensor(seg["attention_mask"]),
                        paddle.to_tensor(seg["reset_memory"]), mask,
                        word_index=paddle.to_tensor(seg["word_index"]))
            mem, mask = out.memories, out.memory_mask
            outs.append({"logits": out.logits.numpy(), "memories": mem.numpy()})
    _assert_close(got, outs)
    # Run to run the same (paddle 3.x's fused oneDNN conv was right on the first run only).
    again = pred.stream(segs)
    assert all(np.array_equal(a[k], b[k]) for a, b in zip(got, again) for k in a)

    ids = segs[0]["input_ids"]
    with pytest.raises(PredictorInputError, match=r"word_index is required by this export "
                                                   r"\(ErnieDocForKeyphrase\): \[batch, seq_len\]"):
        pred.run(ids)
    with pytest.raises(PredictorInputError, match=r"word_index values must be in \[0, 8\)"):
        pred.run(ids, word_index=segs[0]["word_index"] + SEQ_LEN)
    with pytest.raises(PredictorInputError, match=r"word_index must have shape \[2, 8\]"):
        pred.run(ids, word_index=np.zeros((2, 3), "int64"))
    with pytest.raises(PredictorInputError, match=r"word_index must be an integer array"):
        pred.run(ids, word_index=np.zeros((2, SEQ_LEN), "float32"))
    with pytest.raises(PredictorInputError, match=r"unknown input\(s\) span: this export "
                                                   r"takes head inputs: word_index"):
        pred.run(ids, word_index=segs[0]["word_index"], span=1)


def test_heads_without_inputs_of_their_own_refuse_them(bare):
    _, pred, info = bare
    assert "head_inputs" not in info and pred.head_inputs == {}
    with pytest.raises(PredictorInputError, match=r"unknown input\(s\) word_index: this "
                                                   r"export takes head inputs: none"):
        pred.run(np.ones((1, SEQ_LEN), "int64"), word_index=np.zeros((1, SEQ_LEN), "int64"))


def test_head_without_pooled_output_exports(tmp_path):
    """A head that hands back no pooled output (question answering) exports on paddle 2.6 as
    well: its encoder output is rebuilt field by field, not with namedtuple._replace (which
    2.6's static conversion cannot run)."""
    from ernie_doc.heads import ErnieDocForQuestionAnswering
    paddle.seed(29)
    model = ErnieDocForQuestionAnswering(tiny_config())
    model.eval()
    export(model, str(tmp_path / "qa"), seq_len=SEQ_LEN)
    segs = _rows(model.config, 2)
    got = Predictor(str(tmp_path / "qa")).stream(segs)
    assert got[0]["logits"].shape == (2, SEQ_LEN, 2)
    _assert_close(got, _dygraph_fields(model, segs, ["logits"]))
