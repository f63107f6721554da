"""Behaviours the rest of the suite left unexercised (issue 18's list of test gaps): the task
type of the memory slots, the OpenKP n-gram CNN's logit layout, and the adaptive softmax's
column mapping over several tail clusters. Expected values are worked out by hand."""
import math

import numpy as np
import paddle
import pytest
from helpers import tiny_config

from ernie_doc import ErnieDocModel
from ernie_doc.lm.adaptive import ProjectedAdaptiveLogSoftmax

# -- memory slots take the task type of their own row's first token ----------------------


def _official_row0_rule(model, monkeypatch):
    """Make `model` give every row's memory slots batch row 0's first task type, as the
    official code does (m copies of task_ids[0, 0] in front of every row's task ids)."""
    tasks, mem_len = model.embeddings.tasks, model.memory_len

    def row0_tasks(key_task_ids):
        # key_task_ids [B, M+T]: its first M columns are the memory slots' types; column 0
        # of row 0 is row 0's first token type under either rule
        ids = key_task_ids.numpy().copy()
        ids[:, :mem_len] = ids[0, 0]
        return tasks(paddle.to_tensor(ids))

    monkeypatch.setattr(model.embeddings, "tasks", row0_tasks)


def test_memory_slots_take_their_own_rows_first_task_type(monkeypatch):
    paddle.seed(0)
    config = tiny_config(max_position_embeddings=16, memory_len=8)
    model = ErnieDocModel(config)
    model.eval()
    rng = np.random.default_rng(0)
    for layer in model.encoder.layers:
        # the task projection and bias well above their init scale (0.02), so that the task
        # term moves the attention visibly
        for p in (layer.attn.t_proj.weight, layer.attn.r_t_bias):
            p.set_value(rng.standard_normal(p.shape).astype("float32"))
    ids = paddle.to_tensor(rng.integers(4, config.vocab_size, (2, 16)))
    # mixed types inside each row (else the task term cancels in the softmax); row 1 starts
    # with type 1, so the two rules give its memory slots different types
    types = paddle.to_tensor(np.array([[0] * 8 + [1] * 8, [1] * 4 + [0] * 6 + [2] * 6]))
    mem = paddle.to_tensor(rng.standard_normal((2, 2, 8, 32)).astype("float32"))
    with paddle.no_grad():
        ours = model(ids, mem, types)
        # one row at a time, row 0 is the row itself: ours is the batch-independent rule
        for r in range(2):
            alone = model(ids[r:r + 1], mem[:, r:r + 1], types[r:r + 1])
            np.testing.assert_allclose(alone.sequence_output.numpy()[0],
                                       ours.sequence_output.numpy()[r], rtol=0, atol=1e-5)
            np.testing.assert_allclose(alone.memories.numpy()[:, 0],
                                       ours.memories.numpy()[:, r], rtol=0, atol=1e-5)
        _official_row0_rule(model, monkeypatch)
        official = model(ids, mem, types)
    seq, ref = ours.sequence_output.numpy(), official.sequence_output.numpy()
    # row 0 starts with type 0 under both rules; row 1's memory slots get type 0 officially
    np.testing.assert_allclose(ref[0], seq[0], rtol=0, atol=1e-5)
    # ~9e-3 here, 1,000 times the rounding the row-by-row comparison allows
    assert np.abs(ref[1] - seq[1]).max() > 1e-3


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


# -- the adaptive softmax: tail cluster i's head logit is column head_size - i -------------


@pytest.mark.parametrize("div_val", [1, 2])
def test_adaptive_softmax_maps_two_tail_clusters_to_their_head_columns(div_val):
    # V = 6 in clusters [0, 2) head, [2, 4) tail 1, [4, 6) tail 2. Every weight is 0, so
    # each logit is its bias and the hidden state plays no part.
    layer = ProjectedAdaptiveLogSoftmax(6, 4, 4, [2, 4], div_val=div_val)
    for p in layer.parameters():
        p.set_value(np.zeros(p.shape, "float32"))
    log = math.log
    # head columns: words 0, 1, then the cluster logits; Transformer-XL's layout puts tail
    # cluster i at column head_size - i = 4 - i: tail 1 → column 3 (cluster_bias[1]),
    # tail 2 → column 2 (cluster_bias[0]). Head probabilities 0.1 0.2 | 0.3 (tail 2) 0.4
    # (tail 1); inside tail 1: 0.25 0.75; inside tail 2: 0.4 0.6.
    layer.cluster_bias.set_value(np.array([log(3), log(4)], "float32"))
    word_bias = [[log(1), log(2)], [log(1), log(3)], [log(2), log(3)]]
    if div_val == 1:
        layer.out_biases[0].set_value(np.array(sum(word_bias, []), "float32"))
    else:
        for i, b in enumerate(word_bias):
            layer.out_biases[i].set_value(np.array(b, "float32"))
    expected = np.array([0.1, 0.2, 0.4 * 0.25, 0.4 * 0.75, 0.3 * 0.4, 0.3 * 0.6])
    hidden = paddle.to_tensor(np.random.default_rng(0).standard_normal((6, 4)), "float32")
    with paddle.no_grad():
        probs = np.exp(layer.log_prob(hidden).numpy())
        nll = layer(hidden, paddle.arange(6)).numpy()
    np.testing.assert_allclose(probs, np.tile(expected, (6, 1)), rtol=1e-5)
    np.testing.assert_allclose(nll, -np.log(expected), rtol=1e-5)
