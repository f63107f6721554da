"""A fine-tuned model used the Hugging Face way agrees with `pipeline` (ernie_doc/modeling/
reading.py): the folder's tokenizer lays a text out as the segment the model was fine-tuned on
([CLS] last, max_seq_len tokens), `model.read(**enc)` reads it as the run did (twice under the
retrospective feed) and gives the pipeline's probabilities; a plain `model(**enc)` that is not
that reading says so once. A run's OUTPUT_DIR loads through every from_pretrained door."""
import shutil
import warnings

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest
from helpers import tiny_classifier

from ernie_doc import (AutoModel, AutoTokenizer, ErnieDocConfig, ErnieDocForSequenceClassification,
                       pipeline, segment_batches)
from ernie_doc.errors import TokenizerError
from ernie_doc.modeling.reading import ReadingWarning

TEXTS = ["good movie the plot", "awful bad poor actor left right", "the"]


def sharpened(run, dest):
    """A copy of the run's best/ with larger random matrices, so that its probabilities are
    far from 1/2 and its two readings differ (a one-step model's barely do) → that folder."""
    shutil.copytree(run / "best", dest)
    model = AutoModel.from_pretrained(dest)
    paddle.seed(7)
    with paddle.no_grad():
        for param in model.parameters():
            if len(param.shape) == 2:
                param.set_value(paddle.randn(param.shape) * 0.5)
    model.save_pretrained(dest)
    return dest


RUNS = {"retro": (),                              # the retrospective feed (the default)
        "once": ("retro_feed=false",),
        "first": ("segment_layout=cls_first",),    # [CLS] first, padding at the end
        "cut": ("max_doc_tokens=4",)}              # the run read 4 tokens of a document


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{name: (the OUTPUT_DIR of a run with RUNS[name], a sharpened copy of its best/)}."""
    root = tmp_path_factory.mktemp("reading")
    out = {}
    for name, extra in RUNS.items():
        run = tiny_classifier(root / name, *extra)
        out[name] = (run, sharpened(run, root / f"{name}-model"))
    return out


def probabilities(model, enc, call="read"):
    with paddle.no_grad():
        out = model.read(**enc) if call == "read" else model(**enc)
    return F.softmax(out.logits, axis=-1).numpy()


def pipeline_probabilities(folder, texts=TEXTS):
    return np.array([r["probs"] for r in pipeline(str(folder))(texts)])


def test_the_folder_records_how_the_model_reads(folders):
    run, _ = folders["retro"]
    config = ErnieDocConfig.from_pretrained(run / "best")
    assert (config.retro_feed, config.cls_token_id, config.cls_token_idx) == (True, 1, -1)
    assert ErnieDocConfig.from_pretrained(folders["once"][0] / "best").retro_feed is False
    tok = AutoTokenizer.from_pretrained(run / "best")
    assert (tok.segment_layout, tok.model_max_length) == ("cls_last", 16)
    assert tok.segment_stride == 8   # the run's stride: by default the model's memory_len


def test_the_folders_tokenizer_lays_out_the_segment_the_model_reads(folders):
    tok = AutoTokenizer.from_pretrained(folders["retro"][0] / "best")
    enc = tok(TEXTS[0], return_offsets_mapping=True)
    words = tok.encode(TEXTS[0])
    # tokens [SEP] [PAD] ... [CLS], max_seq_len 16: the trainer's classification segment
    assert enc["input_ids"] == words + [2] + [0] * (16 - len(words) - 2) + [1]
    assert enc["attention_mask"] == [1] * (len(words) + 1) + [0] * (16 - len(words) - 2) + [1]
    assert enc["token_type_ids"] == [0] * 16
    assert enc["offset_mapping"][len(words):] == [(0, 0)] * (16 - len(words))
    batch = tok(TEXTS, padding=True, return_tensors="np")
    assert batch["input_ids"].shape == (3, 16) and (batch["input_ids"][:, -1] == 1).all()
    assert tok(TEXTS[0], add_special_tokens=False)["input_ids"] == words


def test_a_text_longer_than_a_segment_is_refused_or_truncated(folders):
    tok = AutoTokenizer.from_pretrained(folders["retro"][0] / "best")
    long = "good movie " * 20
    with pytest.raises(TokenizerError) as info:
        tok(long)
    message = str(info.value)
    assert "\n" not in message
    for part in ("one segment of 16", "truncation=True", "ernie_doc.pipeline",
                 "segment_batches"):
        assert part in message, (part, message)
    ids = tok(long, truncation=True)["input_ids"]
    assert len(ids) == 16 and ids[-2:] == [2, 1] and ids[:14] == tok.encode(long)[:14]


def test_the_layout_survives_save_and_load(folders, tmp_path):
    tok = AutoTokenizer.from_pretrained(folders["retro"][0] / "best")
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert (again.segment_layout, again.model_max_length, again.segment_stride) == \
        ("cls_last", 16, 8)
    assert again(TEXTS)["input_ids"] == tok(TEXTS)["input_ids"]
    (tmp_path / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "WordPieceTokenizer", "segment_layout": "cls_middle"}')
    with pytest.raises(TokenizerError, match="segment_layout 'cls_middle'"):
        AutoTokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "WordPieceTokenizer", "max_doc_tokens": -1}')
    with pytest.raises(TokenizerError, match="max_doc_tokens must be a non-negative integer"):
        AutoTokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "WordPieceTokenizer", "segment_stride": 0}')
    for bad, shown in (("0", "0"), ("true", "True"), ("2.5", "2.5"), (str(10 ** 20), "1000")):
        (tmp_path / "tokenizer_config.json").write_text(
            '{"tokenizer_class": "WordPieceTokenizer", "segment_stride": %s}' % bad)
        with pytest.raises(TokenizerError, match="segment_stride must be a positive integer up "
                                                 "to 1048576, got " + shown):
            AutoTokenizer.from_pretrained(tmp_path)


def read_and_pipeline(folder, texts=TEXTS, **call):
    """(model.read's probabilities of `texts` through the folder's tokenizer, the pipeline's):
    read() itself never warns."""
    model = AutoModel.from_pretrained(folder)
    model.eval()
    enc = AutoTokenizer.from_pretrained(folder)(texts, return_tensors="pd", **call)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReadingWarning)
        got = probabilities(model, enc)
    return got, pipeline_probabilities(folder, texts)


@pytest.mark.parametrize("name", list(RUNS))
@pytest.mark.parametrize("padding", [False, True])
def test_read_gives_the_pipelines_probabilities(folders, name, padding):
    got, expected = read_and_pipeline(folders[name][1], padding=padding)
    assert np.abs(expected - 0.5).max() > 0.1   # a model that tells documents apart
    np.testing.assert_allclose(got, expected, atol=1e-5)


LONG = [" ".join(np.random.default_rng(i).choice(
    ["good", "great", "bad", "awful", "the", "movie", "plot", "actor", "left", "right"], n))
    for i, n in enumerate([40, 3, 61, 25])]   # 1 to 7 segments at T 16, stride 8


def loop_probabilities(folder, texts, batch_size=2):
    """docs/model.md's loop for a fine-tuned classifier: segment_batches with the folder's
    tokenizer (its segment layout, stride and document cut), reading twice when the model
    does, the mean of the softmax over each document's final reading → [docs, labels]."""
    model = AutoModel.from_pretrained(folder)
    model.eval()
    tok = AutoTokenizer.from_pretrained(folder)
    probs, memories = {}, None
    with warnings.catch_warnings(), paddle.no_grad():
        warnings.simplefilter("error", ReadingWarning)
        for batch in segment_batches(texts, tok.model_max_length, batch_size, tok,
                                     retro_feed=model.config.retro_feed, return_tensors="pd"):
            out = model(batch.input_ids, memories, attention_mask=batch.attention_mask,
                        reset_memory=batch.new_doc)
            memories = out.memories
            for row in np.flatnonzero(batch.final):
                probs.setdefault(int(batch.doc_index[row]), []).append(
                    F.softmax(out.logits[row], axis=-1).numpy())
    return np.array([np.mean(probs[i], axis=0) for i in range(len(texts))])


@pytest.mark.parametrize("name", list(RUNS))
def test_a_loop_over_segment_batches_gives_the_pipelines_probabilities(folders, name):
    """For documents longer than a segment: the loop reads what evaluation reads (it read
    each segment once, T−2 apart, [CLS] last whatever the run: 0.48 against the pipeline's
    0.50 on an IMDB review, the label flipped)."""
    got = loop_probabilities(folders[name][1], LONG)
    expected = pipeline_probabilities(folders[name][1], LONG)
    assert np.abs(expected - 0.5).max() > 0.1
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_a_folder_that_records_its_layout_but_not_its_stride_reads_the_runs(folders, tmp_path):
    """A folder saved when tokenizer_config.json recorded the segment layout but not yet the
    stride: segment_batches cut it T−2 apart (14) where the run read 8 apart, a label flipped
    in silence; the stride comes from task.json (its stride, else memory_len)."""
    import json
    folder = tmp_path / "mid"
    shutil.copytree(folders["retro"][1], folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["segment_stride"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert AutoTokenizer.from_pretrained(folder).segment_stride == 8
    np.testing.assert_allclose(loop_probabilities(folder, LONG),
                               pipeline_probabilities(folder, LONG), atol=1e-5)


def test_segment_batches_refuses_what_the_run_did_not_read(folders):
    """Another seq_len than the run tokenizer's segments, a document without tokens (the
    pipeline's error record), a retro_feed that is no bool: ValueError naming it."""
    tok = AutoTokenizer.from_pretrained(folders["retro"][1])
    with pytest.raises(ValueError, match="seq_len 12: this tokenizer lays out its run's "
                                         "segments of 16 tokens"):
        next(segment_batches(["good movie"], 12, 1, tok))
    for blank in ("", "   ", "\u3000"):
        with pytest.raises(ValueError, match="document 1: no tokens"):
            list(segment_batches(["good movie", blank], 16, 2, tok))
    with pytest.raises(ValueError, match="retro_feed must be True or False, got 'false'"):
        next(segment_batches(["good movie"], 16, 1, tok, retro_feed="false"))
    assert len(list(segment_batches(["good movie"], 16, 1, tok, retro_feed=None))) == 1


def test_segment_batches_reads_twice_under_the_retrospective_feed():
    """retro_feed: each row reads its document's segments, then again; `final` marks the
    second reading and `is_last` its last segment only."""
    class Specials:
        cls_token_id, sep_token_id, pad_token_id = 0, 2, 1
    steps = list(segment_batches([[10, 11, 12, 13], [5]], 4, 2, Specials(), retro_feed=True))
    assert [b.input_ids[0].tolist() for b in steps] == [[10, 11, 2, 0], [12, 13, 2, 0]] * 2
    assert [b.doc_index.tolist() for b in steps] == [[0, 1], [0, 1], [0, -1], [0, -1]]
    assert [b.final.tolist() for b in steps] == [[False, False], [False, True],
                                                 [True, False], [True, False]]
    assert [b.is_last.tolist() for b in steps] == [[False, False], [False, True],
                                                   [False, False], [True, False]]
    assert [b.new_doc.tolist() for b in steps] == [[True, True], [False, False],
                                                   [False, True], [False, True]]


def test_a_first_cls_segment_is_padded_to_the_run_length_too(folders):
    tok = AutoTokenizer.from_pretrained(folders["first"][0] / "best")
    words = tok.encode(TEXTS[0])
    # under the retrospective feed the memory holds the segment's last positions: padding
    # included, so the row is the run's full segment
    assert tok(TEXTS[0])["input_ids"] == [1] + words + [2] + [0] * (16 - len(words) - 2)


def test_the_runs_max_doc_tokens_cuts_what_the_tokenizer_lays_out(folders):
    tok = AutoTokenizer.from_pretrained(folders["cut"][0] / "best")
    words = tok.encode(TEXTS[1])
    assert len(words) > 4 and tok.max_doc_tokens == 4
    assert tok(TEXTS[1])["input_ids"] == words[:4] + [2] + [0] * 10 + [1]


def test_another_max_length_is_refused(folders):
    tok = AutoTokenizer.from_pretrained(folders["retro"][0] / "best")
    assert len(tok(TEXTS[0], max_length=16)["input_ids"]) == 16
    with pytest.raises(TokenizerError) as info:
        tok(TEXTS, max_length=12, truncation=True)
    assert "max_length=12" in str(info.value) and "16 tokens" in str(info.value)


def test_padding_without_its_mask_is_refused_by_read_and_said_by_a_call(folders):
    _, folder = folders["once"]
    model = AutoModel.from_pretrained(folder)
    model.eval()
    enc = AutoTokenizer.from_pretrained(folder)(TEXTS, return_tensors="pd")
    with pytest.raises(ValueError, match=r"holds \[PAD\] \(id 0\) in 3 of 3 rows and no "
                                         r"attention_mask"):
        model.read(enc["input_ids"])
    with pytest.warns(ReadingWarning, match="no attention_mask"):
        probabilities(model, {"input_ids": enc["input_ids"]}, call="plain")


def test_a_folder_saved_before_the_record_reads_as_its_task_json_says(folders, tmp_path):
    """A folder whose config.json and tokenizer_config.json predate the record: the run's
    task.json gives the retrospective feed, the layout, the segment length and the stride
    (its own, else the model's memory_len)."""
    import json
    old = tmp_path / "old"
    shutil.copytree(folders["retro"][1], old)
    for name, keys in (("config.json", ("retro_feed", "cls_token_id")),
                       ("tokenizer_config.json", ("segment_layout", "model_max_length",
                                                  "segment_stride"))):
        values = json.loads((old / name).read_text())
        (old / name).write_text(json.dumps({k: v for k, v in values.items() if k not in keys}))
    assert ErnieDocConfig.from_pretrained(old).retro_feed is None   # the file says nothing
    assert AutoModel.from_pretrained(old).config.retro_feed is True
    tok = AutoTokenizer.from_pretrained(old)
    assert (tok.segment_layout, tok.model_max_length, tok.segment_stride) == ("cls_last", 16, 8)
    got, expected = read_and_pipeline(old)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    np.testing.assert_allclose(loop_probabilities(old, LONG), pipeline_probabilities(old, LONG),
                               atol=1e-5)
    record = json.loads((old / "task.json").read_text())
    record["config"]["stride"] = 5
    (old / "task.json").write_text(json.dumps(record))
    assert AutoTokenizer.from_pretrained(old).segment_stride == 5
    record["config"]["max_seq_len"] = 2 ** 31 - 1   # a bad value is one line naming the file
    (old / "task.json").write_text(json.dumps(record))
    with pytest.raises(TokenizerError, match=f"^{old / 'task.json'}: model_max_length must be "
                                             "an integer from 1 to 1048576, got 2147483647$"):
        AutoTokenizer.from_pretrained(old)


def test_a_plain_call_of_a_model_that_reads_twice_says_so_once(folders):
    _, folder = folders["retro"]
    model = AutoModel.from_pretrained(folder)
    model.eval()
    enc = AutoTokenizer.from_pretrained(folder)(TEXTS, return_tensors="pd")
    with pytest.warns(ReadingWarning) as caught:
        plain = probabilities(model, enc, call="plain")
        probabilities(model, enc, call="plain")
    messages = [str(w.message) for w in caught if w.category is ReadingWarning]
    assert len(messages) == 1 and "retrospective feed" in messages[0] \
        and "model.read(**inputs)" in messages[0] and "ernie_doc.pipeline" in messages[0]
    # it is the first reading only: not the model's prediction
    assert np.abs(plain - pipeline_probabilities(folder)).max() > 0.1


def test_other_heads_send_a_plain_call_to_the_pipeline_only():
    """A span model's segment is packed by its task (`[CLS] context [SEP] question [SEP]`):
    no tokenizer call lays it out, so model.read is not offered."""
    from helpers import tiny_config

    from ernie_doc import ErnieDocForQuestionAnswering
    model = ErnieDocForQuestionAnswering(tiny_config(retro_feed=True, cls_token_id=1,
                                                     cls_token_idx=0))
    model.eval()
    ids = paddle.to_tensor([[1, 7, 8, 2, 9, 2]])
    with pytest.warns(ReadingWarning) as caught:
        model(ids, attention_mask=paddle.ones([1, 6]))
    message, = [str(w.message) for w in caught if w.category is ReadingWarning]
    assert "ernie_doc.pipeline(<its folder>) reads documents as it was fine-tuned" in message
    assert "model.read" not in message


def test_a_plain_call_of_a_model_that_reads_once_is_its_reading(folders):
    _, folder = folders["once"]
    model = AutoModel.from_pretrained(folder)
    model.eval()
    enc = AutoTokenizer.from_pretrained(folder)(TEXTS, return_tensors="pd")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReadingWarning)
        plain = probabilities(model, enc, call="plain")
    np.testing.assert_allclose(plain, pipeline_probabilities(folder), atol=1e-5)


def test_cls_where_the_model_does_not_read_it_says_so_once(folders):
    _, folder = folders["once"]
    model = AutoModel.from_pretrained(folder)
    model.eval()
    tok = AutoTokenizer.from_pretrained(folder)
    tok.segment_layout = None   # e.g. the released tokenizer: [CLS] first
    enc = tok(TEXTS, padding=True, return_tensors="pd")
    with pytest.warns(ReadingWarning) as caught:
        probabilities(model, enc, call="plain")
        probabilities(model, enc, call="plain")
    messages = [str(w.message) for w in caught if w.category is ReadingWarning]
    assert len(messages) == 1, messages
    assert "[CLS] (id 1) is not at position -1 in 3 of 3 rows" in messages[0]
    assert "AutoTokenizer.from_pretrained" in messages[0]


def test_the_model_loop_with_memories_is_never_warned_about(folders):
    _, folder = folders["retro"]
    model = AutoModel.from_pretrained(folder)
    model.eval()
    enc = AutoTokenizer.from_pretrained(folder)(TEXTS, return_tensors="pd")
    with warnings.catch_warnings(), paddle.no_grad():
        warnings.simplefilter("error", ReadingWarning)
        first = model(**enc, reset_memory=paddle.ones([3], "bool"))
        model(**enc, memories=first.memories)


def test_a_runs_output_dir_loads_through_every_door(folders, tmp_path):
    run, _ = folders["retro"]
    best = run / "best"
    model = AutoModel.from_pretrained(run)
    assert isinstance(model, ErnieDocForSequenceClassification)
    assert model.load_report.path.startswith(str(best))
    assert ErnieDocForSequenceClassification.from_pretrained(run).config == model.config
    assert ErnieDocConfig.from_pretrained(run) == ErnieDocConfig.from_pretrained(best)
    assert AutoTokenizer.from_pretrained(run)(TEXTS)["input_ids"] == \
        AutoTokenizer.from_pretrained(best)(TEXTS)["input_ids"]
    # a run with final/ only (a pretraining run, or one without evaluation) loads final/
    only_final = tmp_path / "run"
    shutil.copytree(best, only_final / "final")
    assert AutoModel.from_pretrained(only_final).load_report.path.startswith(
        str(only_final / "final"))
    assert AutoTokenizer.from_pretrained(only_final).segment_layout == "cls_last"


def test_a_run_folder_is_read_by_one_rule(folders, tmp_path):
    """The saved model a folder stands for is the same for AutoModel, AutoTokenizer and
    pipeline: the first of it, best/, final/ with task.json; a run without any says so."""
    from ernie_doc.errors import CheckpointError, PipelineError
    from ernie_doc.predict.model_folder import model_directory
    run, _ = folders["retro"]
    both = tmp_path / "both"   # a model of its own beside best/, but no task.json
    shutil.copytree(run / "best", both / "best")
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(folders["once"][1] / name, both / name)
    assert model_directory(str(both)) == str(both / "best")
    assert AutoModel.from_pretrained(both).load_report.path.startswith(str(both / "best"))
    running = tmp_path / "running"   # started, nothing saved yet
    running.mkdir()
    (running / "run_config.yaml").write_text("task: imdb\n")
    for load in (AutoModel.from_pretrained, AutoTokenizer.from_pretrained,
                 ErnieDocConfig.from_pretrained):
        with pytest.raises(CheckpointError, match="a run's OUTPUT_DIR with no best/ or final/"):
            load(running)
    with pytest.raises(PipelineError, match="a run's OUTPUT_DIR with no best/ or final/"):
        pipeline(str(running))


def test_a_pair_is_laid_out_with_its_types(folders):
    tok = AutoTokenizer.from_pretrained(folders["retro"][0] / "best")
    a, b = tok.encode("good movie"), tok.encode("bad plot actor")
    enc = tok("good movie", "bad plot actor")
    pad = 16 - len(a) - len(b) - 3
    assert enc["input_ids"] == a + [2] + b + [2] + [0] * pad + [1]
    assert enc["token_type_ids"] == [0] * (len(a) + 1) + [1] * (len(b) + 1) + [0] * pad + [0]
    assert enc["attention_mask"] == [1] * (len(a) + len(b) + 2) + [0] * pad + [1]
