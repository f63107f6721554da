"""What a Hugging Face or PaddleNLP user types: a checkpoint loaded into another head class
(the recorded class decides: the head is new, the other head's tensors unused), AutoModel,
ErnieDocConfig.from_pretrained / save_pretrained, the top-level names (`pipeline` in both
import orders) and segment_batches, the helper that feeds the model's own loop."""
import json
import logging
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest
from helpers import ROOT, bounded, tiny_config

from ernie_doc import (AutoModel, ErnieDocConfig, ErnieDocForMultipleChoice, ErnieDocForPretraining,
                       ErnieDocForQuestionAnswering, ErnieDocForSequenceClassification,
                       ErnieDocForTokenClassification, ErnieDocModel, segment_batches)
from ernie_doc.errors import CheckpointError

HEAD = ["linear.weight", "linear.bias"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A classification model (num_labels 2, as IMDB's) saved in our layout and PaddleNLP's,
    and the model itself."""
    paddle.seed(5)
    model = ErnieDocForSequenceClassification(tiny_config(), num_labels=2)
    root = tmp_path_factory.mktemp("clf")
    return {"model": model, "ours": model.save_pretrained(root / "ours"),
            "paddlenlp": model.save_pretrained(root / "pn", format="paddlenlp"),
            "official": model.save_pretrained(root / "official", format="official")}


def _same(a, b):
    return np.array_equal(a.numpy(), b.numpy())


# == a checkpoint of one head loaded into another =================================================
@pytest.mark.parametrize("layout", ["ours", "paddlenlp"])
@pytest.mark.parametrize("cls", [ErnieDocForQuestionAnswering, ErnieDocForTokenClassification,
                                 ErnieDocForMultipleChoice])
def test_another_head_class_gets_a_new_head(saved, layout, cls, caplog):
    """config.json records ErnieDocForSequenceClassification: loading it into another head
    class loads the encoder, reports that class's head newly initialised and the classifier's
    tensors unused, and never copies them (the span head used to take linear.weight [H, 2];
    multiple choice failed on its shape)."""
    clf = saved["model"]
    paddle.seed(9)
    fresh = cls(clf.config)
    paddle.seed(9)
    with caplog.at_level(logging.WARNING, logger="ernie_doc.checkpoint"):
        model = cls.from_pretrained(saved[layout])
    report = model.load_report
    assert sorted(report.missing) == sorted(HEAD)
    assert sorted(report.unexpected) == sorted(HEAD)
    assert report.other_head == "ErnieDocForSequenceClassification"
    assert _same(model.linear.weight, fresh.linear.weight)      # its own fresh init
    assert not (model.linear.weight.shape == clf.linear.weight.shape
                and _same(model.linear.weight, clf.linear.weight))
    assert _same(model.ernie_doc.embeddings.word_emb.weight,
                 clf.ernie_doc.embeddings.word_emb.weight)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"Some weights of {cls.__name__} were not initialized from "
                                  f"the checkpoint at ")
    assert "newly initialized: [linear.weight, linear.bias]" in warnings[0]
    assert "ErnieDocForSequenceClassification head" in warnings[0]
    assert "\n" not in warnings[0]


def test_the_recorded_head_class_loads_whole(saved):
    clf = saved["model"]
    for layout in ("ours", "paddlenlp"):
        again = ErnieDocForSequenceClassification.from_pretrained(saved[layout])
        assert again.load_report.missing == [] and again.load_report.unexpected == []
        assert again.load_report.other_head is None
        assert _same(again.linear.weight, clf.linear.weight)
    # no class recorded (official files): the official names tell the heads apart, as before
    span = ErnieDocForQuestionAnswering.from_pretrained(saved["official"])
    assert sorted(span.load_report.missing) == sorted(HEAD)
    assert sorted(span.load_report.unexpected) == ["cls_out_b", "cls_out_w"]


def test_a_subclass_keeps_its_base_head(saved):
    class MyClassifier(ErnieDocForSequenceClassification):
        pass

    model = MyClassifier.from_pretrained(saved["ours"])
    assert model.load_report.missing == [] and model.load_report.other_head is None
    assert _same(model.linear.weight, saved["model"].linear.weight)


# == AutoModel ====================================================================================
def _unrecorded(folder):
    """`folder` (official layout) as the released files are: ernie_config.json records no
    class."""
    path = folder / "ernie_config.json"
    values = json.loads(path.read_text())
    values.pop("architecture")
    path.write_text(json.dumps(values))
    return folder


def _record(saved, tmp_path, name, **changes):
    """A copy of the classifier saved in our layout whose config.json is changed by
    `changes` (key: value, None deletes the key)."""
    folder = saved["model"].save_pretrained(tmp_path / name)
    values = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            values.pop(key, None)
        else:
            values[key] = value
    (folder / "config.json").write_text(json.dumps(values))
    return folder


def test_official_files_record_the_head_class(tmp_path, caplog):
    """Multiple choice shares the classifier's official names (cls_out_*): the class recorded
    beside the official files (ernie_config.json's extra "architecture", which the official
    code, reading keys by name, never looks at) picks it; a classifier's official files
    loaded into multiple choice give a new head, not a shape error (AutoModel used to build a
    classifier with num_labels=1 out of a multiple-choice save)."""
    paddle.seed(3)
    mc = ErnieDocForMultipleChoice(tiny_config(), num_choices=3)
    folder = mc.save_pretrained(tmp_path / "mc", format="official")
    written = json.loads((folder / "ernie_config.json").read_text())
    assert written["architecture"] == {"class": "ErnieDocForMultipleChoice",
                                       "kwargs": {"num_choices": 3}}
    assert written["hidden_size"] == 32 and written["sent_type_vocab_size"] == 4
    model = AutoModel.from_pretrained(folder)
    assert type(model) is ErnieDocForMultipleChoice and model.num_choices == 3
    assert model.load_report.missing == [] and model.load_report.unexpected == []
    assert _same(model.linear.weight, mc.linear.weight)

    clf = ErnieDocForSequenceClassification(tiny_config(), num_labels=2)
    official = clf.save_pretrained(tmp_path / "clf", format="official")
    with caplog.at_level(logging.WARNING, logger="ernie_doc.checkpoint"):
        choice = ErnieDocForMultipleChoice.from_pretrained(official)
    report = choice.load_report
    assert report.other_head == "ErnieDocForSequenceClassification"
    assert sorted(report.missing) == sorted(HEAD)
    assert sorted(report.unexpected) == ["cls_out_b", "cls_out_w"]
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    # the released files record nothing: the official names decide, as the official code
    span = ErnieDocForQuestionAnswering.from_pretrained(_unrecorded(official))
    assert sorted(span.load_report.missing) == sorted(HEAD)


@pytest.mark.parametrize("changes", [
    {"architecture": None},                                  # no class recorded
    {"architecture": {"class": ""}},
    {"architecture": {"class": "Head"}},                     # a base class of every head
    {"architecture": {"class": "Nope\nforged line" * 50}},
    {"architecture": None, "architectures": [], "model_type": "ernie_doc"},
    {"architecture": None, "architectures": [5], "model_type": "ernie_doc"},
    {"architecture": None, "architectures": "ErnieDocForQuestionAnswering",
     "model_type": "ernie_doc"},
], ids=["none", "empty", "base", "hostile", "list-empty", "list-int", "plain-string"])
def test_an_unknown_recorded_class_never_lends_its_head(saved, tmp_path, changes, caplog):
    """With no known class recorded our own names (linear.*) do not say whose head it is: the
    span head starts fresh, the checkpoint's head is unused, one warning line, the recorded
    name quoted and clipped (it used to take the classifier's linear.weight silently)."""
    folder = _record(saved, tmp_path, "rec", **changes)
    with caplog.at_level(logging.WARNING, logger="ernie_doc.checkpoint"):
        span = ErnieDocForQuestionAnswering.from_pretrained(folder)
    report = span.load_report
    assert sorted(report.missing) == sorted(HEAD) and sorted(report.unexpected) == sorted(HEAD)
    assert report.other_head and "\n" not in report.other_head
    assert len(report.other_head) < 200
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0] and len(warnings[0]) < 1000
    assert "newly initialized" in warnings[0]


def test_auto_model_names_an_unknown_recorded_class(saved, tmp_path):
    folder = _record(saved, tmp_path, "typo",
                     architecture={"class": "ErnieDocForSequenceClassificatio"})
    with pytest.raises(CheckpointError) as e:
        AutoModel.from_pretrained(folder)
    message = str(e.value)
    assert "unknown model class 'ErnieDocForSequenceClassificatio'" in message
    assert "did you mean ErnieDocForSequenceClassification?" in message
    assert "ErnieDocForQuestionAnswering" in message and "\n" not in message


def test_a_head_no_config_names_says_how_and_a_training_checkpoint_says_so(saved, tmp_path):
    """Weights alone (no config.json): the line says how to name the class; a trainer
    checkpoint (checkpoints/step-N: weights and trainer_state.json) points to its run."""
    import shutil
    step = tmp_path / "run" / "checkpoints" / "step-2"
    step.mkdir(parents=True)
    shutil.copy(os.path.join(saved["ours"], "model.safetensors"), step)
    with pytest.raises(CheckpointError) as e:
        AutoModel.from_pretrained(str(step))
    assert str(e.value).endswith(
        ": holds a 'linear' head but no config names its class; load it with its class "
        "(ErnieDocForSequenceClassification / ErnieDocForQuestionAnswering / "
        "ErnieDocForTokenClassification / ErnieDocForMultipleChoice / "
        "ErnieDocForPairMatching).from_pretrained(path), or record the class in its "
        'config.json: "architecture": {"class": "ErnieDocForSequenceClassification"}')
    (step / "trainer_state.json").write_text('{"step": 2, "total_steps": 5}')
    with pytest.raises(CheckpointError) as e:
        AutoModel.from_pretrained(str(step))
    line = (f"{step}: a training checkpoint (what `--resume` continues), not a saved model; "
            f"give the run's folder {tmp_path / 'run'}, or its best/ or final/")
    assert str(e.value) == line
    # every other door says the same (they said "pass config=", "no config file", "no
    # tokenizer files in", or read trainer_state.json as a model config)
    from ernie_doc import AutoTokenizer
    from ernie_doc.errors import ConfigError
    for load, error in ((ErnieDocForSequenceClassification.from_pretrained, CheckpointError),
                        (ErnieDocModel.from_pretrained, CheckpointError),
                        (ErnieDocConfig.from_pretrained, ConfigError),
                        (AutoTokenizer.from_pretrained, FileNotFoundError)):
        with pytest.raises(error) as e:
            load(str(step))
        assert str(e.value) == line, load
    with pytest.raises(ConfigError) as e:
        ErnieDocConfig.from_pretrained(str(step / "trainer_state.json"))
    assert str(e.value) == line
    alone = tmp_path / "step-2"   # copied out of its run
    shutil.copytree(step, alone)
    with pytest.raises(CheckpointError) as e:
        AutoModel.from_pretrained(str(alone))
    assert str(e.value).endswith("not a saved model; give the run's OUTPUT_DIR, or its best/ or "
                                 "final/")


@pytest.mark.parametrize("kwargs, match", [
    ("x", "'architecture.kwargs' must be an object"),
    ([1, 2], "'architecture.kwargs' must be an object"),
    ({"num_labels": 100000000}, "'architecture.kwargs.num_labels' must be at most 65536"),
])
def test_malformed_architecture_kwargs_are_one_error(saved, tmp_path, kwargs, match):
    """Refused naming config.json and the key, before anything is built (num_labels 1e8 used
    to allocate a [H, 1e8] head)."""
    folder = _record(saved, tmp_path, "kw", architecture={
        "class": "ErnieDocForSequenceClassification", "kwargs": kwargs})
    for load in (AutoModel.from_pretrained, ErnieDocForSequenceClassification.from_pretrained):
        with bounded(), pytest.raises(CheckpointError, match=match) as e:
            load(folder)
        assert "config.json" in str(e.value) and "\n" not in str(e.value)
    with bounded(), pytest.raises(ValueError, match="num_labels must be at most 65536"):
        ErnieDocForSequenceClassification(tiny_config(), num_labels=1 << 30)


def test_auto_model_builds_the_recorded_class(saved, tmp_path):
    model = AutoModel.from_pretrained(saved["ours"])
    assert type(model) is ErnieDocForSequenceClassification and model.num_labels == 2
    assert model.load_report.missing == [] and model.load_report.unexpected == []
    assert _same(model.linear.weight, saved["model"].linear.weight)
    assert type(AutoModel.from_pretrained(saved["paddlenlp"])) is \
        ErnieDocForSequenceClassification
    assert type(AutoModel.from_pretrained(saved["official"])) is \
        ErnieDocForSequenceClassification
    span = ErnieDocForQuestionAnswering(tiny_config()).save_pretrained(tmp_path / "span")
    assert type(AutoModel.from_pretrained(span, recurrence="xl")) is ErnieDocForQuestionAnswering
    bare = ErnieDocModel(tiny_config()).save_pretrained(tmp_path / "bare")
    encoder = AutoModel.from_pretrained(bare, recurrence="xl")
    assert type(encoder) is ErnieDocModel and encoder.config.recurrence == "xl"
    # the pretraining heads alone, no class recorded (as the released files): the encoder
    pre = ErnieDocForPretraining(tiny_config())
    released = _unrecorded(pre.save_pretrained(tmp_path / "released", format="official"))
    encoder = AutoModel.from_pretrained(released)
    assert type(encoder) is ErnieDocModel
    assert any(n.startswith("mask_lm") for n in encoder.load_report.unexpected)
    assert type(AutoModel.from_pretrained(pre.save_pretrained(tmp_path / "pre"))) is \
        ErnieDocForPretraining   # recorded
    with pytest.raises(TypeError, match="from_pretrained"):
        AutoModel(tiny_config())
    with pytest.raises(CheckpointError, match="no such file"):
        AutoModel.from_pretrained(tmp_path / "missing")


# == ErnieDocConfig.from_pretrained / save_pretrained =============================================
def test_config_from_pretrained_and_save_pretrained(saved, tmp_path, monkeypatch):
    want = saved["model"].config
    for layout in ("ours", "paddlenlp"):
        assert ErnieDocConfig.from_pretrained(saved[layout]) == want
    official = ErnieDocConfig.from_pretrained(saved["official"])   # ernie_config.json
    assert official.hidden_size == want.hidden_size and official.vocab_size == want.vocab_size
    assert ErnieDocConfig.from_pretrained(saved["ours"], recurrence="xl").recurrence == "xl"

    cfg = tiny_config(recurrence="xl")
    assert cfg.save_pretrained(tmp_path / "cfg") == tmp_path / "cfg"
    assert json.loads((tmp_path / "cfg" / "config.json").read_text())["recurrence"] == "xl"
    assert ErnieDocConfig.from_pretrained(tmp_path / "cfg") == cfg
    assert ErnieDocConfig.from_pretrained(tmp_path / "cfg" / "config.json") == cfg
    # written into a saved model's folder: the head class it records is kept
    cfg.replace(num_labels=2).save_pretrained(saved["ours"])
    model = AutoModel.from_pretrained(saved["ours"])
    assert type(model) is ErnieDocForSequenceClassification and model.config.recurrence == "xl"
    want.save_pretrained(saved["ours"])   # as the fixture wrote it, for the other tests
    assert ErnieDocConfig.from_pretrained("ernie-doc-small") == \
        ErnieDocConfig.from_preset("ernie-doc-small")
    # a released name: its preset, which is the released files' config; nothing is fetched
    monkeypatch.setenv("ERNIE_DOC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ERNIE_DOC_OFFLINE", "1")
    assert ErnieDocConfig.from_pretrained("ernie-doc-base-zh") == \
        ErnieDocConfig.from_preset("ernie-doc-base-zh")
    assert not (tmp_path / "home").exists()
    with pytest.raises(ValueError, match="not a released name or preset") as e:
        ErnieDocConfig.from_pretrained(str(tmp_path / "missing"))
    assert "\n" not in str(e.value)

    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config file") as e:
        ErnieDocConfig.from_pretrained(tmp_path / "empty")
    assert "\n" not in str(e.value)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text('{"hidden_size": 33, "num_attention_heads": 2}')
    with pytest.raises(ValueError, match=r"bad/config.json: hidden_size \(33\)"):
        ErnieDocConfig.from_pretrained(tmp_path / "bad")


def test_config_from_pretrained_overrides_say_what_is_wrong():
    """A released name with a bad override: the override's error, not "not a released
    name" (an unknown key suggests the nearest)."""
    with pytest.raises(ValueError, match=r"ernie-doc-base-en: hidden_size \(64\) must be "
                                         r"divisible by num_attention_heads"):
        ErnieDocConfig.from_pretrained("ernie-doc-base-en", hidden_size=64)
    with pytest.raises(ValueError, match=r"unknown config key 'hiden_size' \(did you mean "
                                         r"'hidden_size'\?\)"):
        ErnieDocConfig.from_pretrained("ernie-doc-base-en", hiden_size=3)


def test_config_save_pretrained_keeps_the_keys_it_does_not_own(saved, tmp_path, caplog):
    """Into a PaddleNLP folder: architectures, model_type, id2label / label2id (still 2
    classes) and PaddleNLP's attention_dropout_prob spelling stay; a size change warns."""
    folder = saved["model"].save_pretrained(tmp_path / "pn", format="paddlenlp")
    before = json.loads((folder / "config.json").read_text())
    saved["model"].config.replace(recurrence="xl").save_pretrained(folder)
    after = json.loads((folder / "config.json").read_text())
    assert set(before) <= set(after)
    for key in ("architectures", "architecture", "model_type", "id2label", "label2id"):
        assert after[key] == before[key], key
    assert after["recurrence"] == "xl"
    assert type(AutoModel.from_pretrained(folder)) is ErnieDocForSequenceClassification
    with caplog.at_level(logging.WARNING, logger="ernie_doc.checkpoint"):
        saved["model"].config.replace(num_labels=3).save_pretrained(folder)
    after = json.loads((folder / "config.json").read_text())
    assert "id2label" not in after and after["architectures"] == before["architectures"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "num_labels (2 -> 3)" in warnings[0]


# == top-level names ==============================================================================
_PIPELINE_CHECKS = """
from ernie_doc import pipeline
import ernie_doc, ernie_doc.predict.pipeline as module
assert pipeline is module.pipeline is ernie_doc.pipeline, (pipeline, module)
try:
    pipeline("/nonexistent/run")
except module.PipelineError as e:
    print("factory:", e)
"""


def test_from_ernie_doc_import_pipeline_in_both_orders():
    """`from ernie_doc import pipeline` gives the factory ernie_doc.predict.pipeline.pipeline,
    whether its module was imported before (here) or not (a fresh interpreter)."""
    run = subprocess.run([sys.executable, "-c", _PIPELINE_CHECKS], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "factory: " in run.stdout and "/nonexistent/run" in run.stdout
    import ernie_doc.predict.pipeline  # noqa: F401  the other order, in this process
    exec(_PIPELINE_CHECKS, {})


def test_top_level_names():
    import ernie_doc
    from ernie_doc import auto, data, tokenization
    assert ernie_doc.AutoModel is auto.AutoModel
    assert ernie_doc.segment_batches is data.segment_batches
    if hasattr(tokenization, "AutoTokenizer"):
        assert ernie_doc.AutoTokenizer is tokenization.AutoTokenizer
    else:   # not there yet: only that name is missing, the others still import
        with pytest.raises(AttributeError, match="AutoTokenizer"):
            ernie_doc.AutoTokenizer
    assert {"AutoModel", "AutoTokenizer", "pipeline", "segment_batches"} <= set(ernie_doc.__all__)


# == segment_batches ==============================================================================
class _Specials:
    cls_token_id, sep_token_id, pad_token_id = 0, 2, 1


def test_segment_batches_streams_documents_through_rows():
    docs = [list(range(10, 20)), [5, 6, 7], [8]]
    steps = list(segment_batches(iter(docs), 5, batch_size=2, tokenizer=_Specials()))
    ids = [b.input_ids.tolist() for b in steps]
    assert ids == [[[10, 11, 12, 2, 0], [5, 6, 7, 2, 0]],
                   [[13, 14, 15, 2, 0], [8, 2, 1, 1, 0]],      # row 1 takes the next document
                   [[16, 17, 18, 2, 0], [1, 1, 1, 1, 1]],      # then pads
                   [[19, 2, 1, 1, 0], [1, 1, 1, 1, 1]]]
    assert [b.new_doc.tolist() for b in steps] == [[True, True], [False, True], [False, True],
                                                   [False, True]]
    assert [b.doc_index.tolist() for b in steps] == [[0, 1], [0, 2], [0, -1], [0, -1]]
    assert [b.is_last.tolist() for b in steps] == [[False, True], [False, True],
                                                   [False, False], [True, False]]
    assert steps[1].attention_mask.tolist()[1] == [1, 1, 0, 0, 1]
    ids, mask, new_doc = steps[0]                                  # unpacks as the loop does
    assert ids.dtype == np.int64 and mask.dtype == np.float32 and new_doc.dtype == bool
    # no tokenizer: windows of T tokens as they are (run-document's cut)
    raw = list(segment_batches([list(range(10, 17))], 4, pad_id=1))
    assert [b.input_ids.tolist() for b in raw] == [[[10, 11, 12, 13]], [[14, 15, 16, 1]]]
    with pytest.raises(ValueError, match="pad_id"):
        next(segment_batches([[1]], 4))
    with pytest.raises(ValueError, match="seq_len"):
        next(segment_batches([[1]], 0, pad_id=1))


class _Words(_Specials):
    """A tokenizer of a 30-id vocabulary: each word is its length + 10."""
    vocab_size = 30

    def encode(self, text):
        return [len(word) + 10 for word in text.split()]


def test_segment_batches_reads_text_with_a_tokenizer_and_checks_ids():
    """A str is tokenized with tokenizer.encode (it used to be cut into characters); without
    a tokenizer, floats, negative ids or ids beyond the vocabulary: one ValueError naming the
    document. Sizes that cannot fit are refused before any array is made."""
    steps = list(segment_batches(["a bb ccc", [11, 12]], 6, batch_size=2, tokenizer=_Words()))
    assert steps[0].input_ids.tolist() == [[11, 12, 13, 2, 1, 0], [11, 12, 2, 1, 1, 0]]
    with pytest.raises(ValueError, match=r"^document 0: documents are token ids: pass a "
                                         r"tokenizer or tok.encode\(text\)$"):
        next(segment_batches(["some text"], 4, pad_id=1))
    for doc, match in (([1.5, 2.0], "integer token ids"), ([3, -1], "token id -1"),
                       ([3, 30], "token id 30 is outside the vocabulary")):
        with pytest.raises(ValueError, match=f"^document 1: .*{match}"):
            list(segment_batches([[3], doc], 6, tokenizer=_Words()))
    for kwargs, name in (({"seq_len": 1 << 21}, "seq_len"), ({"batch_size": 1 << 17},
                                                               "batch_size")):
        args = {"seq_len": 8, "batch_size": 1, **kwargs}
        with bounded(), pytest.raises(ValueError, match=f"^{name} must be an integer from 1 to "):
            next(segment_batches([[3]], args["seq_len"], args["batch_size"], pad_id=1))


def test_the_model_loop_over_segment_batches_keeps_documents_apart():
    """The README's loop: each document's last pooled output read in a batch of 2 rows (a row
    taking the next document with new_doc) equals that document read alone."""
    paddle.seed(3)
    model = ErnieDocModel(tiny_config(max_position_embeddings=8))
    model.eval()
    rng = np.random.RandomState(0)
    docs = [rng.randint(4, 60, n).tolist() for n in (20, 5, 9)]

    def last_pooled(documents, batch_size):
        found, memories = {}, None
        with paddle.no_grad():
            for batch in segment_batches(documents, 8, batch_size, _Specials(),
                                         return_tensors="pd"):
                ids, mask, new_doc = batch
                out = model(ids, memories, attention_mask=mask, reset_memory=new_doc)
                memories = out.memories
                for row in np.flatnonzero(batch.is_last):
                    found[int(batch.doc_index[row])] = out.pooled_output.numpy()[row]
        return found

    together = last_pooled(docs, 2)
    assert sorted(together) == [0, 1, 2]
    for i, doc in enumerate(docs):
        np.testing.assert_allclose(together[i], last_pooled([doc], 1)[0], atol=1e-5)
