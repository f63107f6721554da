"""Checkpoint safety (issue 13 §1, §3): a pickle payload in a checkpoint runs nowhere, damaged or
mismatched weights are one-line errors, and real paddle.save files still load bit-exact through
the restricted unpickler. Every fixture is written by the test."""
import json
import os
import pickle
import struct
import tracemalloc
import zlib  # noqa: F401  before paddle (2.6.2 + scipy import order)

import numpy as np
import paddle
import pytest
from helpers import tiny_config
from safetensors.numpy import load_file, save_file

from ernie_doc import ErnieDocModel
from ernie_doc.checkpoint import io, safe_pickle
from ernie_doc.checkpoint.lodtensor import write_lodtensor
from ernie_doc.errors import CheckpointError, CheckpointStateError
from ernie_doc.heads import ErnieDocForSequenceClassification
from ernie_doc.training import state as ckpt


# == fixtures =====================================================================================
class Payload:
    """Unpickling this runs `call(*args)`: what a hostile .pdparams does."""

    def __init__(self, call, *args):
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args


def payloads(marker):
    """(payload, the global the refusal must name) for several ways of running code."""
    import subprocess
    marker = str(marker)
    return {
        "os.system": (Payload(os.system, f"touch {marker}"), f"{os.system.__module__}.system"),
        "exec": (Payload(exec, f"open({marker!r}, 'w').close()"), "builtins.exec"),
        "subprocess": (Payload(subprocess.call, ["touch", marker]), "subprocess.call"),
        "eval": (Payload(eval, f"open({marker!r}, 'w').close()"), "builtins.eval called with"),
    }


def hostile_state(marker, kind="os.system", protocol=4):
    """A state dict with real tensors and one payload in the middle → pickle bytes, name."""
    payload, name = payloads(marker)[kind]
    state = {"embeddings.word_emb.weight": np.zeros([60, 32], np.float32), "x": payload,
             "pooler.dense.bias": np.zeros([32], np.float32)}
    return pickle.dumps(state, protocol=protocol), name


def one_line(error, *parts):
    message = str(error.value) if hasattr(error, "value") else str(error)
    assert "\n" not in message, message
    for part in parts:
        assert str(part) in message, (part, message)
    return message


def paddlenlp_dir(tmp_path, model=None, name="pn"):
    """A PaddleNLP-layout directory (model_state.pdparams + config.json) of a tiny model."""
    model = model or ErnieDocModel(tiny_config())
    model.save_pretrained(tmp_path / name, format="paddlenlp")
    return tmp_path / name


def tiny_trainable():
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(3, 4), paddle.nn.LayerNorm(4))
    scheduler = paddle.optimizer.lr.LambdaDecay(0.1, lambda s: 1.0 / (1 + s))
    opt = paddle.optimizer.AdamW(learning_rate=scheduler, parameters=model.parameters())
    return model, opt, scheduler


def train_steps(model, opt, scheduler, n):
    for i in range(n):
        (model(paddle.full([2, 3], float(i + 1))) ** 2).sum().backward()
        opt.step()
        opt.clear_grad()
        scheduler.step()


TRAINER_STATE = {"step": 2, "epoch": 0, "total_steps": 5}


def saved_run(tmp_path):
    """A tiny model trained 2 steps and checkpointed → (model, opt, scheduler, step dir)."""
    model, opt, scheduler = tiny_trainable()
    train_steps(model, opt, scheduler, 2)
    step = ckpt.save_training_state(str(tmp_path / "run"), 2, model, opt, TRAINER_STATE,
                                    {"memories": np.arange(6, dtype=np.float32)})
    return model, opt, scheduler, step


# == 1. no code runs from a checkpoint ============================================================
@pytest.mark.parametrize("kind", ["os.system", "exec", "subprocess", "eval"])
@pytest.mark.parametrize("protocol", [2, 4])
def test_payloads_are_refused_naming_file_and_global(tmp_path, kind, protocol):
    marker = tmp_path / "MARKER"
    data, name = hostile_state(marker, kind, protocol)
    path = tmp_path / "model_state.pdparams"
    path.write_bytes(data)
    with pytest.raises(CheckpointError) as e:
        safe_pickle.load(path)
    one_line(e, path, "refusing to load", name)
    assert not marker.exists()


def _lm_dir(tmp_path, data):
    from ernie_doc.lm.model import CONFIG_FILE, TransformerXLConfig
    directory = tmp_path / "lm"
    directory.mkdir()
    config = TransformerXLConfig(vocab_size=50, n_layer=1, d_model=16, n_head=2, d_head=8,
                                 d_inner=32, tgt_len=4, mem_len=4, cutoffs=[20], div_val=2)
    (directory / CONFIG_FILE).write_text(json.dumps(config.to_dict()))
    (directory / "model_state.pdparams").write_bytes(data)
    return directory, directory / "model_state.pdparams"


def _pickle_resume_dir(tmp_path, data):
    """A step directory in paddle.save's layout whose model.pdparams is the payload."""
    model, opt, scheduler = tiny_trainable()
    train_steps(model, opt, scheduler, 1)
    step = tmp_path / "run" / "checkpoints" / "step-1"
    step.mkdir(parents=True)
    paddle.save(ckpt.optimizer_state(model, opt), str(step / "optimizer.pdopt"))
    (step / "trainer_state.json").write_text(json.dumps(TRAINER_STATE))
    np.savez(step / "rank-0.npz", memories=np.zeros(3, np.float32))
    (step / "model.pdparams").write_bytes(data)
    return step, step / "model.pdparams", model, opt


@pytest.mark.parametrize("entry", ["from_pretrained", "read_checkpoint", "convert_checkpoint"])
def test_every_entry_point_refuses_the_payload(tmp_path, capsys, entry):
    marker = tmp_path / "MARKER"
    data, name = hostile_state(marker)
    directory = paddlenlp_dir(tmp_path)
    path = directory / "model_state.pdparams"
    path.write_bytes(data)
    if entry == "from_pretrained":
        with pytest.raises(CheckpointError) as e:
            ErnieDocModel.from_pretrained(directory)
    elif entry == "read_checkpoint":
        with pytest.raises(CheckpointError) as e:
            io.read_checkpoint(directory)
    else:
        from tools.convert_checkpoint import main
        assert main([str(directory), str(tmp_path / "out"), "--to", "ours"]) == 2
        e = capsys.readouterr().err.strip()
        assert e.startswith("error: ") and not (tmp_path / "out").exists()
    one_line(e, path, f"refusing to load: the pickle calls {name}, which a paddle state dict "
                      f"never contains")
    assert not marker.exists()


# == 2. what paddle writes still loads, bit-exact =================================================
def _assert_same(ours, ref):
    assert list(ours) == list(ref)
    for key in ref:
        assert isinstance(ours[key], np.ndarray), key
        assert ours[key].dtype == ref[key].dtype and ours[key].shape == ref[key].shape, key
        assert ours[key].tobytes() == ref[key].tobytes(), key


@pytest.mark.parametrize("protocol", [2, 3, 4])
def test_paddle_save_state_dicts_load_bit_exact(tmp_path, protocol):
    paddle.seed(2)
    model = paddle.nn.Sequential(paddle.nn.Linear(3, 4), paddle.nn.LayerNorm(4))
    state = dict(model.state_dict())
    state["half"] = paddle.to_tensor(np.array([0.1, -2.5, 6e-5], np.float16))
    state["bf16"] = paddle.to_tensor(np.array([1.5, -3.0], np.float32)).astype("bfloat16")
    state["ids"] = paddle.to_tensor(np.array([[1, -2], [3, 2 ** 40]], np.int64))
    state["flags"] = paddle.to_tensor(np.array([True, False]))
    path = tmp_path / "m.pdparams"
    paddle.save(state, str(path), protocol=protocol)
    got = safe_pickle.load_state_dict(path)
    want = {k: v.numpy() for k, v in state.items()}
    assert want["bf16"].dtype == np.uint16          # paddle's bfloat16: its uint16 bits
    _assert_same(got, want)
    # io reads the bfloat16 bits as float32, exactly
    tensors, skipped = io._read_pdparams(str(path))
    assert tensors["bf16"].dtype == np.float32 and tensors["bf16"].tolist() == [1.5, -3.0]
    assert skipped == []


def test_paddle_save_tensor_forms_load(tmp_path):
    """Non-state-dict pickles: a dygraph Tensor as (tuple, ((name, array),)), a static
    LoDTensor as (eval, ('data', {'data': array})), numpy scalars, the LR scheduler dict."""
    model, opt, scheduler = tiny_trainable()
    train_steps(model, opt, scheduler, 1)
    state = ckpt.optimizer_state(model, opt)          # holds a bool: pickled tensor by tensor
    core = paddle.base.core if hasattr(paddle, "base") else paddle.fluid.core
    dense = (getattr(core, "LoDTensor", None) or core.DenseTensor)()
    dense.set(np.arange(6, dtype=np.float32).reshape(2, 3), paddle.CPUPlace())
    for protocol in (2, 4):
        path = tmp_path / f"o{protocol}.pdopt"
        paddle.save(dict(state, dense=dense, scalar=np.float64(0.25)), str(path),
                    protocol=protocol)
        got = safe_pickle.load(path)
        assert got[ckpt.STRUCTURED] is True and got["scalar"] == 0.25
        assert got["LR_Scheduler"] == scheduler.state_dict()
        assert np.array_equal(got["dense"], np.arange(6, dtype=np.float32).reshape(2, 3))
        tensors = {k: v.numpy() for k, v in state.items() if isinstance(v, paddle.Tensor)}
        _assert_same({k: got[k] for k in tensors}, tensors)


def test_big_parameter_slices_are_joined(tmp_path):
    """paddle.save with protocol 2/3 cuts tensors over 1 GiB into `key@@.i` slices and an
    UnpackBigParamInfor@@ entry (too big to write here: the layout is built by hand)."""
    full = np.arange(12, dtype=np.float32).reshape(3, 4)
    flat = full.ravel()
    state = {"w@@.0": flat[:5], "w@@.1": flat[5:], "b": np.ones(2, np.float32),
             safe_pickle.BIG_PARAM_INFO: {"w": {"OriginShape": (3, 4),
                                                "slices": ["w@@.0", "w@@.1"]}},
             safe_pickle.NAME_TABLE: {"w": "linear_0.w_0", "b": "linear_0.b_0"}}
    path = tmp_path / "big.pdparams"
    path.write_bytes(pickle.dumps(state, protocol=2))
    got = safe_pickle.load_state_dict(path)
    assert sorted(got) == ["b", "w"] and np.array_equal(got["w"], full)
    ref = paddle.load(str(path), return_numpy=True)  # paddle's own reading of the layout
    assert np.array_equal(ref["w"], got["w"])


def test_paddlenlp_save_pretrained_loads_bit_exact(tmp_path):
    try:
        import paddlenlp.transformers as pnlp
    except Exception as e:  # noqa: BLE001  an environment problem, not ours
        pytest.skip(f"paddlenlp does not import here: {type(e).__name__}: {e}")
    paddle.seed(4)
    theirs = pnlp.ErnieDocModel(pnlp.ErnieDocConfig(num_hidden_layers=1, hidden_size=16,
                                                    num_attention_heads=2, vocab_size=30,
                                                    max_position_embeddings=8, memory_len=2))
    theirs.save_pretrained(str(tmp_path / "pn"))
    got = safe_pickle.load_state_dict(tmp_path / "pn" / "model_state.pdparams")
    _assert_same(got, {k: v.numpy() for k, v in theirs.state_dict().items()})


# == 3. damaged or mismatched weights =============================================================
@pytest.mark.parametrize("damage, needle", [
    (lambda raw: b"", "empty file (0 bytes)"),
    (lambda raw: b"PK\x03\x04 not a pickle at all" * 4, "not a paddle.save file"),
    (lambda raw: raw[:len(raw) // 2], "truncated"),
    (lambda raw: raw.replace(b"_reconstruct", b"_reconstrucX", 1),
     "the pickle calls numpy.core.multiarray._reconstrucX, which a paddle state dict never"),
])
def test_damaged_pdparams_is_one_line(tmp_path, damage, needle):
    directory = paddlenlp_dir(tmp_path)
    path = directory / "model_state.pdparams"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CheckpointError) as e:
        ErnieDocModel.from_pretrained(directory)
    one_line(e, path, needle)


def _official_dir(tmp_path):
    ErnieDocModel(tiny_config()).save_pretrained(tmp_path / "off", format="official")
    return tmp_path / "off"


def _lod_header(lod_bytes=None, dims=(60, 32)):
    """A LoDTensor header: version 0, then lod_level 1 with `lod_bytes` offsets, or lod_level
    0 and FP32 dims."""
    desc = b"\x08\x05" + b"".join(b"\x10" + bytes([d]) if d < 128 else
                                  b"\x10" + bytes([d & 0x7F | 0x80]) + bytes([d >> 7])
                                  for d in dims)
    lod = struct.pack("<QQ", 1, lod_bytes) if lod_bytes is not None else struct.pack("<Q", 0)
    return struct.pack("<I", 0) + lod + struct.pack("<Ii", 0, len(desc)) + desc


@pytest.mark.parametrize("content, needle", [
    (b"", "empty file (0 bytes)"),
    (b"this is not a tensor\n", "not a LoDTensor file"),
    (_lod_header()[:30], "truncated"),
    (_lod_header(lod_bytes=1 << 60), "declares 1152921504606846976 bytes"),
    (_lod_header(dims=(16000, 16000)), "needs 1024000000 data bytes, found 0"),
], ids=["zero-bytes", "garbage", "truncated", "huge-lod-header", "huge-dims"])
def test_broken_official_tensor_is_an_error_not_missing(tmp_path, content, needle):
    directory = _official_dir(tmp_path)
    path = directory / "word_embedding"
    path.write_bytes(content)
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError) as e:
            ErnieDocModel.from_pretrained(directory)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    one_line(e, path, needle)
    assert peak < 50 << 20, peak   # nothing near the declared size was allocated


def _rewrite_ours(tmp_path, model, edit, name="ours"):
    """Save `model` in our layout, then apply edit({key: array}) to its tensors."""
    model.save_pretrained(tmp_path / name)
    path = tmp_path / name / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))
    return tmp_path / name


def test_no_encoder_tensor_matched_is_an_error_even_with_allow_partial(tmp_path):
    directory = tmp_path / "other"
    directory.mkdir()
    paddle.save({"conv1.weight": paddle.ones([2, 2]), "fc.bias": paddle.ones([3])},
                str(directory / "model_state.pdparams"))
    (directory / "config.json").write_text(json.dumps(tiny_config().to_dict()))
    count = len(ErnieDocModel(tiny_config()).state_dict())
    for allow in (False, True):
        with pytest.raises(CheckpointError) as e:
            ErnieDocModel.from_pretrained(directory, allow_partial=allow)
        one_line(e, directory / "model_state.pdparams",
                 f"none of the {count} encoder tensors of ErnieDocModel is in the checkpoint",
                 "it holds 2 tensors")


def test_partial_encoder_is_an_error_unless_allowed(tmp_path):
    paddle.seed(3)
    model = ErnieDocModel(tiny_config())
    directory = _rewrite_ours(tmp_path, model, lambda t: t.pop("encoder.layers.1.norm2.bias"))
    with pytest.raises(CheckpointError) as e:
        ErnieDocModel.from_pretrained(directory)
    one_line(e, directory / "model.safetensors", "partial checkpoint for ErnieDocModel: 1 of "
             f"{len(model.state_dict())} encoder tensors missing (encoder.layers.1.norm2.bias)",
             "allow_partial")
    got = ErnieDocModel.from_pretrained(directory, allow_partial=True)
    assert got.load_report.missing == ["encoder.layers.1.norm2.bias"]
    assert np.array_equal(got.encoder.layers[0].norm1.weight.numpy(),
                          model.encoder.layers[0].norm1.weight.numpy())


def test_head_only_partly_there_and_unknown_tensors(tmp_path):
    clf = ErnieDocForSequenceClassification(tiny_config(), num_labels=3)
    directory = _rewrite_ours(tmp_path, clf, lambda t: t.pop("linear.bias"), "half-head")
    with pytest.raises(CheckpointError) as e:
        ErnieDocForSequenceClassification.from_pretrained(directory)
    one_line(e, "the ErnieDocForSequenceClassification head is only partly there (missing "
                "linear.bias)")
    assert ErnieDocForSequenceClassification.from_pretrained(
        directory, allow_partial=True).load_report.missing == ["linear.bias"]

    def extra(tensors):
        tensors["ernie_doc.encoder.adapter.weight"] = np.zeros([2], np.float32)
        tensors["lm_head.transform.weight"] = np.zeros([32, 32], np.float32)  # another head's
    directory = _rewrite_ours(tmp_path, clf, extra, "extra")
    with pytest.raises(CheckpointError) as e:
        ErnieDocForSequenceClassification.from_pretrained(directory)
    one_line(e, "1 tensors that belong to no known head (ernie_doc.encoder.adapter.weight)")
    # A head wholly absent is a new head; other heads' tensors are left aside: no error.
    directory = _rewrite_ours(tmp_path, clf, lambda t: (t.pop("linear.bias"),
                                                        t.pop("linear.weight"),
                                                        t.update({"lm_head.decoder_bias":
                                                                  np.zeros(60, np.float32)})),
                              "new-head")
    got = ErnieDocForSequenceClassification.from_pretrained(directory, num_labels=2)
    assert got.load_report.missing == ["linear.weight", "linear.bias"]
    assert got.load_report.unexpected == ["lm_head.decoder_bias"]


def test_encoder_of_another_config_and_unknown_official_files(tmp_path):
    ErnieDocModel(tiny_config(num_hidden_layers=3)).save_pretrained(tmp_path / "three")
    with pytest.raises(CheckpointError) as e:
        ErnieDocModel.from_pretrained(tmp_path / "three", num_hidden_layers=2)
    one_line(e, "23 encoder tensors this model does not have, is the config right? "
                "(encoder.layers.2.")
    directory = _official_dir(tmp_path)
    write_lodtensor(directory / "my_adapter.w_0", np.ones([2], np.float32))
    write_lodtensor(directory / "cls_out_w", np.ones([32, 2], np.float32))   # another head's
    with pytest.raises(CheckpointError) as e:
        ErnieDocModel.from_pretrained(directory)
    one_line(e, "1 tensors that belong to no known head (my_adapter.w_0)")
    os.remove(directory / "my_adapter.w_0")
    assert ErnieDocModel.from_pretrained(directory).load_report.unexpected == ["cls_out_w"]


@pytest.mark.parametrize("dtype, ok", [(np.int64, False), (np.int32, False), (np.bool_, False),
                                       (np.float16, True), (np.float64, True)])
def test_dtype_that_cannot_be_cast_is_an_error(tmp_path, dtype, ok):
    model = ErnieDocModel(tiny_config())
    key = "embeddings.word_emb.weight"
    values = (np.arange(60 * 32).reshape(60, 32) % 2).astype(dtype)
    directory = _rewrite_ours(tmp_path, model, lambda t: t.update({key: values}))
    if ok:
        got = ErnieDocModel.from_pretrained(directory)
        assert np.array_equal(got.embeddings.word_emb.weight.numpy(), values.astype(np.float32))
        return
    with pytest.raises(CheckpointError) as e:
        ErnieDocModel.from_pretrained(directory)
    one_line(e, key, f"a {np.dtype(dtype)} tensor cannot load into a float32 parameter")


def test_wrong_shape_through_init_checkpoint_is_one_line(tmp_path, capsys):
    ErnieDocForSequenceClassification(tiny_config(), num_labels=2).save_pretrained(
        tmp_path / "ckpt")
    from tools.finetune import main
    with pytest.raises(SystemExit) as e:
        main(["--set", "task=longdep", "model=ernie-doc-small",
              "model_overrides={hidden_size: 16, num_attention_heads: 2}",
              "reader={num_docs: {train: 4, dev: 4}, segment_tokens: 14, max_segments: 2}",
              "max_seq_len=16", "stride=14", "batch_size=2", "epochs=1", "progress=false",
              f"init_checkpoint={tmp_path / 'ckpt'}", f"output_dir={tmp_path / 'run'}"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and "Traceback" not in err, err
    assert f"{tmp_path / 'ckpt'}" in err and "tensor shape(s) differ from the model" in err
    assert "ernie_doc.embeddings.norms.0.bias: checkpoint [32] vs model [16]" in err
    assert "(58 in all)" in err
    assert not (tmp_path / "run").exists()      # nothing written


# == --resume: our checkpoints hold no pickle, and everything is checked ====================
def test_resume_round_trip_is_exact_and_pickle_free(tmp_path):
    model, opt, scheduler, step = saved_run(tmp_path)
    assert sorted(os.listdir(step)) == ["model.safetensors", "optimizer.json",
                                        "optimizer.safetensors", "rank-0.npz",
                                        "trainer_state.json"]
    again, opt2, scheduler2 = tiny_trainable()
    state, arrays = ckpt.load_training_state(step, again, opt2)
    assert state == TRAINER_STATE and arrays["memories"].tolist() == list(range(6))
    assert scheduler2.last_epoch == scheduler.last_epoch
    for m, o, s in ((model, opt, scheduler), (again, opt2, scheduler2)):
        train_steps(m, o, s, 2)
    for a, b in zip(model.parameters(), again.parameters()):
        assert a.numpy().tobytes() == b.numpy().tobytes()


def test_resume_never_reads_a_pickle(tmp_path):
    """A step directory holding paddle.save pickles (model.pdparams, optimizer.pdopt) is no
    checkpoint of ours: resume names a missing file of its own format and unpickles nothing."""
    marker = tmp_path / "MARKER"
    data, _ = hostile_state(marker)
    step, _, model, opt = _pickle_resume_dir(tmp_path, data)
    before = [p.numpy().tobytes() for p in model.parameters()]
    with pytest.raises(CheckpointStateError) as e:
        ckpt.load_training_state(str(step), model, opt)
    one_line(e, step, ": missing")
    assert not marker.exists()
    assert [p.numpy().tobytes() for p in model.parameters()] == before


def test_the_language_model_never_reads_a_pickle(tmp_path):
    """A language-model folder holding a paddle.save pickle instead of model.safetensors:
    one line naming the missing file, and nothing unpickled."""
    from ernie_doc.lm.model import TransformerXLLM
    marker = tmp_path / "MARKER"
    data, _ = hostile_state(marker)
    directory, _ = _lm_dir(tmp_path, data)
    with pytest.raises(CheckpointError) as e:
        TransformerXLLM.from_pretrained(directory)
    one_line(e, directory, "no model.safetensors")
    assert not marker.exists()


def _drop_tensor(path):
    tensors = load_file(path)
    tensors.pop(sorted(tensors)[0])
    save_file(tensors, path, metadata={"format": "np", "bfloat16": "[]"})


def _int_tensor(path):
    tensors = load_file(path)
    tensors["0.weight"] = tensors["0.weight"].astype(np.int64)
    save_file(tensors, path, metadata={"format": "np", "bfloat16": "[]"})


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


@pytest.mark.parametrize("name, damage, needle", [
    ("model.safetensors", lambda p: open(p, "wb").close(), "unreadable"),
    ("model.safetensors", _drop_tensor, "does not match the model being resumed: missing 0.bias"),
    ("model.safetensors", _int_tensor, "0.weight int64 [3, 4] (model float32 [3, 4])"),
    ("optimizer.safetensors", _truncate, "unreadable"),
    ("optimizer.safetensors", _drop_tensor, "does not match optimizer.json: missing"),
    ("optimizer.json", lambda p: open(p, "w").write("{"), "unreadable"),
    ("trainer_state.json", lambda p: open(p, "w").write("[1, 2]"), "expected a JSON object"),
    ("trainer_state.json", lambda p: open(p, "wb").close(), "unreadable"),
    ("rank-0.npz", lambda p: open(p, "wb").write(b"garbage"), "unreadable"),
    ("rank-0.npz", lambda p: np.savez(p, m=np.array([{"a": 1}], dtype=object)), "unreadable"),
], ids=["model-empty", "model-missing-tensor", "model-int", "optimizer-truncated",
        "optimizer-missing-tensor", "optimizer-json", "state-list", "state-empty",
        "npz-garbage", "npz-pickle"])
def test_damaged_resume_checkpoint_is_one_line_and_loads_nothing(tmp_path, name, damage, needle):
    _, _, _, step = saved_run(tmp_path)
    path = os.path.join(step, name)
    damage(path)
    model, opt, _ = tiny_trainable()
    before = [p.numpy().copy() for p in model.parameters()]
    with pytest.raises(CheckpointStateError) as e:
        ckpt.load_training_state(step, model, opt)
    one_line(e, path, needle)
    assert all(np.array_equal(a, p.numpy()) for a, p in zip(before, model.parameters()))
