"""Task heads: shapes, memories passed through, official names, tied MLM output."""
import numpy as np
import paddle
import pytest
from helpers import tiny_config

from ernie_doc.heads import (HEADS, NUM_REORDER_CLASSES, ErnieDocForMultipleChoice,
                             ErnieDocForPretraining, ErnieDocForQuestionAnswering,
                             ErnieDocForSequenceClassification)


def test_head_shapes_and_memories():
    config = tiny_config()
    ids = paddle.randint(4, 60, [4, 16])
    expected = {"sequence_classification": [4, 3], "question_answering": [4, 16, 2],
                "token_classification": [4, 16, 3], "multiple_choice": [1, 4]}
    for name, shape in expected.items():
        kwargs = {"num_labels": 3} if name in ("sequence_classification",
                                               "token_classification") else {}
        model = HEADS[name](config, **kwargs)
        model.eval()
        out = model(ids)
        assert list(out.logits.shape) == shape, name
        assert list(out.memories.shape) == [2, 4, 4, 32]
        # the head's encoder output is the bare model's on the same weights
        bare = model.ernie_doc(ids)
        assert np.array_equal(out.encoder.sequence_output.numpy(), bare.sequence_output.numpy())


def test_classifier_is_linear_on_pooled_output():
    model = ErnieDocForSequenceClassification(tiny_config(), num_labels=2)
    model.eval()
    assert model.dropout.p == 0.1                  # the official fixed classifier dropout
    out = model(paddle.randint(4, 60, [2, 16]))
    manual = paddle.matmul(out.encoder.pooled_output, model.linear.weight) + model.linear.bias
    assert np.allclose(out.logits.numpy(), manual.numpy(), atol=1e-6)


def test_span_logits():
    model = ErnieDocForQuestionAnswering(tiny_config())
    model.eval()
    out = model(paddle.randint(4, 60, [2, 16]))
    assert list(out.start_logits.shape) == [2, 16]
    assert np.array_equal(out.end_logits.numpy(), out.logits.numpy()[:, :, 1])


def test_multiple_choice_rows():
    model = ErnieDocForMultipleChoice(tiny_config(), num_choices=4)
    model.eval()
    out = model(paddle.randint(4, 60, [8, 16]))
    per_row = paddle.matmul(out.encoder.pooled_output, model.linear.weight) + model.linear.bias
    assert np.allclose(out.logits.numpy(), per_row.numpy().reshape(2, 4), atol=1e-6)
    with pytest.raises(ValueError, match="multiple of num_choices"):
        model(paddle.randint(4, 60, [6, 16]))


def test_pretraining_heads():
    config = tiny_config()
    model = ErnieDocForPretraining(config)
    # official init: MLM LayerNorm bias starts at 1
    assert np.all(model.lm_head.layer_norm.bias.numpy() == 1.0)
    names = set(model.state_dict())
    assert set(model.official_names) <= names
    assert not any("decoder.weight" in n for n in names)    # output tied to word_emb
    ids = paddle.randint(4, 60, [2, 16])
    out = model(ids, masked_positions=paddle.to_tensor([1, 17, 30]))
    assert list(out.mlm_logits.shape) == [3, 60]
    assert list(out.reorder_logits.shape) == [2, NUM_REORDER_CLASSES]
    # gathered rows = logits of those flat positions
    full = model(ids).mlm_logits.reshape([-1, 60]).numpy()
    assert np.allclose(out.mlm_logits.numpy(), full[[1, 17, 30]], atol=1e-5)
    (out.mlm_logits.sum() + out.reorder_logits.sum()).backward()
    assert float(model.ernie_doc.embeddings.word_emb.weight.grad.abs().sum()) > 0


def test_official_head_names_cover_head_parameters():
    config = tiny_config()
    for name, cls in HEADS.items():
        model = cls(config)
        own = {n for n in model.state_dict() if not n.startswith("ernie_doc.")}
        assert own == set(cls.official_names), name


def test_registry_holds_every_head():
    from ernie_doc import auto
    from ernie_doc.heads import ErnieDocForPairMatching
    from tasks.hotpotqa.head import ErnieDocForHotpotQA
    from tasks.openkp.head import ErnieDocForKeyphrase
    classes = auto.head_classes()
    assert {k: classes[k] for k in HEADS} == dict(HEADS)   # the built-ins, by their names
    assert classes["pair_matching"] is ErnieDocForPairMatching
    assert classes["hotpotqa"] is ErnieDocForHotpotQA
    assert classes["keyphrase"] is ErnieDocForKeyphrase
    assert auto.head_names() == sorted(classes)
    assert auto.model_class("ErnieDocForHotpotQA") is ErnieDocForHotpotQA
    assert auto.model_class("ErnieDocModel").__name__ == "ErnieDocModel"
    assert auto.model_class("NoSuchClass") is None
    with pytest.raises(ValueError, match="unknown head 'nope'; choose one of hotpotqa, "):
        auto.head_class("nope")
    with pytest.raises(TypeError):
        HEADS["mine"] = ErnieDocForHotpotQA   # read-only: register through ernie_doc.auto


def test_register_head_refuses_a_taken_name():
    from ernie_doc import auto
    from ernie_doc.heads import Head
    cls = auto.head_class("question_answering")
    assert auto.register_head("question_answering")(cls) is cls   # again: a no-op

    class Other(Head):
        pass
    with pytest.raises(ValueError, match="'question_answering' is already registered"):
        auto.register_head("question_answering")(Other)
    with pytest.raises(TypeError, match="not a subclass of ernie_doc.heads.Head"):
        auto.register_head("plain")(object)
    assert "plain" not in auto.head_names()


def test_official_names_of_every_head_are_known_to_the_checkpoint_package():
    """ernie_doc.checkpoint reads official directories without any head class: the names it
    knows (checkpoint.names) cover every registered head's."""
    from ernie_doc import auto
    from ernie_doc.checkpoint import names
    for name, cls in auto.head_classes().items():
        assert set(cls.official_names.values()) <= names.official_head_names(), name
        assert {k.split(".")[0] for k in cls.official_names} <= names.official_head_modules()
    assert auto.official_head_names() == names.official_head_names()


def test_export_shapes_of_the_heads():
    config = tiny_config()
    expected = {"sequence_classification": [[4, 3]], "question_answering": [[4, 16, 2]],
                "token_classification": [[4, 16, 3]], "multiple_choice": [[1, 4]],
                "pair_matching": [[2]]}
    for name, shapes in expected.items():
        kwargs = {"num_labels": 3} if "num_labels" in HEADS[name].__init__.__code__.co_varnames \
            else {}
        model = HEADS[name](config, **kwargs)
        assert model.exportable, name
        assert [s for _, s in model.export_outputs(4, 16)] == shapes, name
        model.eval()
        out = model(paddle.randint(4, 60, [4, 16]))
        assert list(out.logits.shape) == shapes[0], name   # what forward gives
        assert model.export_outputs(-1, 16)[0][1][0] == -1   # a dynamic batch stays dynamic
    assert not ErnieDocForPretraining.exportable
    assert HEADS["pair_matching"](config).rows_problem("batch rows", 3) == \
        "pair matching: batch rows (3) must come in pairs"


# -- the OpenKP n-gram CNN: logit [i, n-1] scores the n words starting at word i ------------


def test_openkp_cnn_logit_scores_the_ngram_starting_at_word_i():
    from tasks.openkp.head import MAX_GRAM, ErnieDocForKeyphrase
    H, T = 8, 10
    model = ErnieDocForKeyphrase(tiny_config(hidden_size=H, max_position_embeddings=T))
    model.eval()
    # Channel 0 of conv n sums 10**j times feature 0 of the window's j-th word; scorer n reads
    # channel 0. So logit [i, n-1] = sum_j 10**j * w[i + j], w = feature 0 of each word,
    # a number whose digits, from the units up, are the n words from word i on.
    for n, (conv, scorer) in enumerate(zip(model.ngram_convs, model.ngram_scorers), 1):
        weight = np.zeros([H, H, n], "float32")
        weight[0, 0, :] = [10.0 ** j for j in range(n)]
        conv.weight.set_value(weight)
        conv.bias.set_value(np.zeros([H], "float32"))
        score = np.zeros([H, 1], "float32")
        score[0, 0] = 1.0
        scorer.weight.set_value(score)
        scorer.bias.set_value(np.zeros([1], "float32"))
    # word k's first sub-token is at token position word_index[k]; feature 0 of token p is p
    word_index = [1, 2, 4, 5, 7, 9, 0, 0, 0, 0]   # six words, then padding (position 0)
    seq = np.zeros([1, T, H], "float32")
    seq[0, :, 0] = np.arange(T)
    logits = model.score_words(paddle.to_tensor(seq),
                               paddle.to_tensor([word_index], dtype="int32")).numpy()[0]
    assert logits.shape == (T, MAX_GRAM)
    # by hand: words w = 1 2 4 5 7 9, then padding words read position 0 (value 0)
    assert logits[:, 0].tolist() == [1, 2, 4, 5, 7, 9, 0, 0, 0, 0]
    assert logits[0, 1] == 21 and logits[4, 1] == 97        # (1, 2) and (7, 9)
    assert logits[1, 2] == 542                               # (2, 4, 5)
    assert logits[2, 3] == 9754                              # (4, 5, 7, 9)
    assert logits[0, 4] == 75421 and logits[1, 4] == 97542   # (1 2 4 5 7), (2 4 5 7 9)
    assert logits[5, 1] == 9                                 # (9, padding)
    # n-grams that would run past the last slot do not exist: zeros
    for n in range(2, MAX_GRAM + 1):
        assert (logits[T - n + 1:, n - 1] == 0).all()
