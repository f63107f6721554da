"""The pretraining loss against a cross-entropy worked out here from the model's full logits
(MLM over the masked tokens of the rows that train, plus segment reordering on the rows at a
document's last segment only, each weighted by `mlm_weight` / `reorder_weight`), and the
held-out evaluation (`reader.eval_corpus`, `reader.eval_docs`) of a `format: file` corpus
end to end against a segment-by-segment reading of the final model."""
import json

import numpy as np
import pytest
from helpers import tiny_config

WORDS = [f"w{i}" for i in range(30)]
SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]   # ids 0..4


def write_vocab(root):
    vocab = root / "vocab"
    vocab.mkdir()
    (vocab / "vocab.txt").write_text("\n".join(SPECIALS + WORDS) + "\n", encoding="utf-8")
    return vocab


def log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_loss_is_mlm_plus_reorder_on_last_segments_with_their_weights(tmp_path):
    import paddle

    from ernie_doc.data.collate import collate
    from ernie_doc.data.segment import CLS_INDEX
    from ernie_doc.heads import ErnieDocForPretraining
    from ernie_doc.kinds import build_task
    from ernie_doc.pretraining.corpus import CorpusDocument
    from ernie_doc.run_config import load_config
    from ernie_doc.tokenization import load_tokenizer
    tokenizer = load_tokenizer(write_vocab(tmp_path))
    T = 16
    cfg = load_config(None, ["task=pretrain", "kind=pretraining", f"data_dir={tmp_path}",
                             "max_steps=1", f"max_seq_len={T}", "retro_feed=false",
                             "task_options.mask_prob=0.3"])
    task = build_task(cfg)
    task.setup({"cls": 1, "sep": 2, "pad": 0}, T, None, tokenizer)
    rng = np.random.default_rng(0)
    steps = [task.document_steps(CorpusDocument(f"d:{d}", " ".join(rng.choice(WORDS, n)),
                                                "d", d), 0, d)
             for d, n in enumerate((30, 20, 8))]   # windows of 14 tokens: 3, 2, 1 segments
    assert [len(s) for s in steps] == [3, 2, 1]
    # rows: a first and a last segment of d0, d1's last and d2's only segment, d1's first
    # segment (weight 0 below) and a padding row
    rows = [steps[0][0], steps[0][2], steps[1][1], steps[2][0], steps[1][0], None]
    batch = collate(rows, [True] * 6, T, 0)
    weight = task.train_weight(batch).astype("float32")
    weight[4] = 0.0
    assert weight.tolist() == [1, 1, 1, 1, 0, 0]
    assert batch["is_last"].tolist() == [False, True, True, True, False, False]
    tensors = {k: paddle.to_tensor(v) for k, v in batch.items()}

    model = ErnieDocForPretraining(tiny_config(
        vocab_size=len(tokenizer), max_position_embeddings=T, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, relu_dropout=0.0,
        cls_token_idx=CLS_INDEX[cfg.segment_layout]))
    model.eval()
    out, _ = task.forward(model, tensors, task.init_carry(model, 6))
    # the logits of every position (no masked_positions), read by hand
    full = model(tensors["input_ids"], model.ernie_doc.init_memories(6),
                 tensors["token_type_ids"], tensors["attention_mask"],
                 tensors["reset_memory"])
    mlm_lp = log_softmax(full.mlm_logits.numpy())          # [B, T, V]
    reorder_lp = log_softmax(full.reorder_logits.numpy())  # [B, 33]
    labels = batch["target_mlm_labels"]
    r, t = np.nonzero((labels >= 0) & (weight[:, None] > 0))
    assert len(r) >= 8 and set(r) == {0, 1, 2, 3}
    mlm = -mlm_lp[r, t, labels[r, t]].mean()
    last = np.nonzero((weight > 0) & batch["is_last"])[0]
    reorder_labels = batch["target_reorder_label"].reshape(-1)
    reorder = -reorder_lp[last, reorder_labels[last]].mean()
    # every weighted row instead of the last segments only would be another number
    every = np.nonzero(weight > 0)[0]
    assert abs(-reorder_lp[every, reorder_labels[every]].mean() - reorder) > 1e-3

    for mlm_weight, reorder_weight in ((1.0, 1.0), (0.0, 1.0), (1.0, 0.0), (2.0, 1.0),
                                       (1.0, 2.0)):
        task.options.update(mlm_weight=mlm_weight, reorder_weight=reorder_weight)
        expected = mlm_weight * mlm + reorder_weight * reorder
        w = paddle.to_tensor(weight)
        assert float(task.loss(out, tensors, w)) == pytest.approx(expected, rel=1e-5)
        loss, scalars = task.train_loss(out, tensors, w)
        assert float(loss) == pytest.approx(expected, rel=1e-5)
        assert scalars["mlm_loss"] == pytest.approx((mlm * len(r), len(r)), rel=1e-5)
        assert scalars["reorder_loss"] == pytest.approx((reorder * len(last), len(last)),
                                                        rel=1e-5)
        means = task.combine_metrics({"mlm_loss": mlm, "reorder_loss": reorder})
        assert means["loss"] == pytest.approx(expected, rel=1e-9)


def write_file_corpus(root, name, files, seed):
    """`files` documents, one per file, each two paragraphs apart by a blank line (a
    blank_lines reader would see two documents in each) → (directory, word counts)."""
    rng = np.random.default_rng(seed)
    folder = root / name
    folder.mkdir()
    counts = []
    for i in range(files):
        a, b = (list(rng.choice(WORDS, int(rng.integers(10, 25)))) for _ in range(2))
        (folder / f"doc{i}.txt").write_text(" ".join(a) + "\n\n" + " ".join(b) + "\n",
                                            encoding="utf-8")
        counts.append(len(a) + len(b))
    return folder, counts


def test_held_out_evaluation_of_a_file_corpus_end_to_end(tmp_path):
    import paddle

    from ernie_doc.heads import ErnieDocForPretraining
    from ernie_doc.pretraining.corpus import iter_documents
    from ernie_doc.run_config import load_config
    from ernie_doc.training.prepare import prepare
    from ernie_doc.training.trainer import Trainer
    vocab = write_vocab(tmp_path)
    corpus, _ = write_file_corpus(tmp_path, "corpus", 6, seed=1)
    held_out, counts = write_file_corpus(tmp_path, "eval", 3, seed=2)
    out = tmp_path / "run"
    cfg = load_config(None, [
        "task=pretrain", "kind=pretraining", f"data_dir={corpus}", f"tokenizer={vocab}",
        "model=ernie-doc-small",
        "model_overrides={num_hidden_layers: 2, hidden_size: 32, num_attention_heads: 2, "
        "memory_len: 8, max_position_embeddings: 16, hidden_dropout_prob: 0.0, "
        "attention_probs_dropout_prob: 0.0, relu_dropout: 0.0}",
        "max_seq_len=16", "batch_size=2", "max_steps=3", "learning_rate=0.01",
        "warmup_steps=1", "logging_steps=0", "progress=false", "reader.format=file",
        f"reader.eval_corpus={held_out}", "reader.eval_docs=2", f"output_dir={out}"])
    run = prepare(cfg)
    Trainer(run).train()

    results = json.loads((out / "eval_results.json").read_text())
    assert results["split"] == "dev" and results["step"] == 3
    # format file: a file is one document (doc id "folder/name:1"); eval_docs: the first 2
    predictions = [json.loads(line) for line in open(out / "predictions_dev.jsonl")]
    assert [p["doc_id"] for p in predictions] == ["eval/doc0.txt:1", "eval/doc1.txt:1"]
    assert results["documents"] == 2
    # 15 % of each document's tokens (one per word here), rounded half up
    assert results["masked_tokens"] == sum(int(np.floor(0.15 * n + 0.5)) for n in counts[:2])

    # the final model (the one evaluated at the last step) read document by document: the
    # skim pass feeds its memory to the retrospective pass, which alone is scored
    model = ErnieDocForPretraining.from_pretrained(str(out / "final"))
    model.eval()
    nll = correct = count = reorder_right = 0.0
    docs = list(iter_documents(held_out, split="file"))[:2]
    for d, doc in enumerate(docs):
        segments = run.task.document_segments(doc, d, run.tokenizer)
        assert all(s.token_type_ids is None for s in segments)   # collated as type 0
        memories, memory_mask = model.ernie_doc.init_memories(1), None
        for reading in ("skim", "retro"):
            for i, s in enumerate(segments):
                with paddle.no_grad():
                    o = model(paddle.to_tensor(s.input_ids[None]), memories,
                              paddle.zeros([1, len(s.input_ids)], dtype="int64"),
                              paddle.to_tensor(s.attention_mask[None]),
                              paddle.to_tensor([reading == "skim" and i == 0]), memory_mask)
                memories, memory_mask = o.memories, o.memory_mask
                if reading == "skim":
                    continue
                labels = s.targets["mlm_labels"]
                at = np.nonzero(labels >= 0)[0]
                lp = log_softmax(o.mlm_logits.numpy()[0])
                nll -= lp[at, labels[at]].sum()
                correct += (lp[at].argmax(-1) == labels[at]).sum()
                count += len(at)
                if s.is_last:
                    reorder_right += int(o.reorder_logits.numpy()[0].argmax()
                                         == s.targets["reorder_label"])
    assert count == results["masked_tokens"]
    assert results["mlm_loss"] == pytest.approx(nll / count, rel=1e-4)
    assert results["mlm_accuracy"] == pytest.approx(correct / count, abs=1e-9)
    assert results["mlm_perplexity"] == pytest.approx(np.exp(nll / count), rel=1e-4)
    assert results["reorder_accuracy"] == pytest.approx(reorder_right / len(docs), abs=1e-9)
