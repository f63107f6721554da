"""Checkpoint formats: LoDTensor files, the official name map, the three layouts, conversions.

Tiny configs only. Official-name checkpoints are built here from the parameter table of the
official static programs (`ernie-doc/model/static/ernie.py`, `transformer_encoder.py`), written
out again below, independently of ernie_doc.checkpoint.names.
"""
import json
import os
import pickle
import struct
import subprocess
import sys
import tracemalloc
import zlib  # noqa: F401  before paddle (2.6.2 + scipy import order)

import numpy as np
import paddle
import pytest
from helpers import tiny_config
from safetensors.numpy import load_file, save_file

from ernie_doc import ErnieDocModel, auto
from ernie_doc.checkpoint import io, lodtensor, names, safe_pickle
from ernie_doc.checkpoint.lodtensor import read_lodtensor, write_lodtensor
from ernie_doc.config import ErnieDocConfig
from ernie_doc.errors import CheckpointError, CheckpointStateError, LoDTensorFormatError
from ernie_doc.heads import HEADS, ErnieDocForPretraining, ErnieDocForSequenceClassification
from ernie_doc.training import state as ckpt

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PADDLE_2 = paddle.__version__.startswith("2.")
TINY = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, vocab_size=60,
            max_position_embeddings=16, memory_len=4)
H, V, L = 32, 60, 2
POS_ROWS = 2 * 16 + 4
NUM_LABELS = 3


def tiny(**kw):
    return ErnieDocConfig(**{**TINY, **kw})


# -- the official parameter table (model/static/ernie.py, transformer_encoder.py) ---------------
def official_table(cfg, head=None, shared=False):
    """[(official name, shape, our bare/head key)] for `cfg`; head None/'cls'/'pretraining'."""
    h, v = cfg.hidden_size, cfg.vocab_size
    rows = [("word_embedding", [v, h], "embeddings.word_emb.weight"),
            ("pos_embedding", [2 * cfg.max_position_embeddings + cfg.memory_len, h],
             "embeddings.pos_emb.weight"),
            ("task_embedding", [3, h], "embeddings.token_type_emb.weight")]
    for i, part in enumerate(("emb", "r_pos", "r_task")):
        rows += [(f"pre_encoder_{part}_layer_norm_scale", [h], f"embeddings.norms.{i}.weight"),
                 (f"pre_encoder_{part}_layer_norm_bias", [h], f"embeddings.norms.{i}.bias")]
    for i in range(cfg.num_hidden_layers):
        att, ours = f"encoder_layer_{i}_multi_head_att_", f"encoder.layers.{i}."
        for off, mine in (("query", "q"), ("key", "k"), ("value", "v"), ("pos", "r"),
                          ("task", "t"), ("output", "out")):
            rows += [(f"{att}{off}_fc.w_0", [h, h], f"{ours}attn.{mine}_proj.weight"),
                     (f"{att}{off}_fc.b_0", [h], f"{ours}attn.{mine}_proj.bias")]
        if not shared:
            rows += [(f"{att}r_{x}_bias", [h], f"{ours}attn.r_{x}_bias") for x in "wrt"]
        for off, mine in (("post_att", "norm1"), ("post_ffn", "norm2")):
            rows += [(f"encoder_layer_{i}_{off}_layer_norm_scale", [h], f"{ours}{mine}.weight"),
                     (f"encoder_layer_{i}_{off}_layer_norm_bias", [h], f"{ours}{mine}.bias")]
        rows += [(f"encoder_layer_{i}_ffn_fc_0.w_0", [h, 4 * h], f"{ours}ffn.linear1.weight"),
                 (f"encoder_layer_{i}_ffn_fc_0.b_0", [4 * h], f"{ours}ffn.linear1.bias"),
                 (f"encoder_layer_{i}_ffn_fc_1.w_0", [4 * h, h], f"{ours}ffn.linear2.weight"),
                 (f"encoder_layer_{i}_ffn_fc_1.b_0", [h], f"{ours}ffn.linear2.bias")]
    if shared:
        rows += [(f"encoder_r_{x}_bias", [h], f"encoder.r_{x}_bias") for x in "wrt"]
    rows += [("pooled_fc.w_0", [h, h], "pooler.dense.weight"),
             ("pooled_fc.b_0", [h], "pooler.dense.bias")]
    if head == "cls":
        rows += [("cls_out_w", [h, NUM_LABELS], "linear.weight"),
                 ("cls_out_b", [NUM_LABELS], "linear.bias")]
    elif head == "pretraining":
        rows += [("mask_lm_trans_fc.w_0", [h, h], "lm_head.transform.weight"),
                 ("mask_lm_trans_fc.b_0", [h], "lm_head.transform.bias"),
                 ("mask_lm_trans_layer_norm_scale", [h], "lm_head.layer_norm.weight"),
                 ("mask_lm_trans_layer_norm_bias", [h], "lm_head.layer_norm.bias"),
                 ("mask_lm_out_fc.b_0", [v], "lm_head.decoder_bias"),
                 ("multi_sent_sorted_fc.w_0", [h, 33], "reorder_head.weight"),
                 ("multi_sent_sorted_fc.b_0", [33], "reorder_head.bias")]
    return rows


HEAD_CLASS = {None: ErnieDocModel, "cls": ErnieDocForSequenceClassification,
              "pretraining": ErnieDocForPretraining}
OPTIMIZER_FILES = ("word_embedding_moment1_0", "word_embedding_moment2_0",
                   "pooled_fc.w_0_beta1_pow_acc_0", "pooled_fc.w_0_beta2_pow_acc_0",
                   "@LR_DECAY_COUNTER@", "learning_rate_0", "scheduled_learning_rate",
                   "encoder_layer_0_ffn_fc_0.w_0.master", "loss_scaling_0",
                   "num_good_steps_0", "num_bad_steps_0")


def official_config_json(cfg):
    return {"attention_probs_dropout_prob": 0.0, "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
            "hidden_size": cfg.hidden_size, "initializer_range": 0.02,
            "max_position_embeddings": cfg.max_position_embeddings,
            "num_attention_heads": cfg.num_attention_heads,
            "num_hidden_layers": cfg.num_hidden_layers, "sent_type_vocab_size": 4,
            "task_type_vocab_size": 3, "vocab_size": cfg.vocab_size,
            "memory_len": cfg.memory_len, "epsilon": 1e-12}


def make_official(root, cfg, head=None, shared=False, dtype=np.float32, seed=0, nested=True):
    """A released-tarball-like tree: root/ernie_config.json, root/vocab.txt, root/params/<one
    file per official name + optimizer state>. Returns (root, {official name: array})."""
    rng = np.random.default_rng(seed)
    params = os.path.join(root, "params") if nested else root
    os.makedirs(params, exist_ok=True)
    arrays = {}
    for name, shape, _ in official_table(cfg, head, shared):
        arrays[name] = rng.standard_normal(shape).astype(dtype)
        write_lodtensor(os.path.join(params, name), arrays[name])
    for name in OPTIMIZER_FILES:
        write_lodtensor(os.path.join(params, name), np.ones([2], np.float32))
    with open(os.path.join(root, "ernie_config.json"), "w") as f:
        json.dump(official_config_json(cfg), f)
    with open(os.path.join(root, "vocab.txt"), "w") as f:
        f.write("[CLS]\n[PAD]\n")
    return root, arrays


def state(model):
    return {k: v.numpy() for k, v in model.state_dict().items()}


def assert_state_equal(a, b):
    sa, sb = (m if isinstance(m, dict) else state(m) for m in (a, b))
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and np.array_equal(sa[k], sb[k]), k


INPUT_IDS = np.array([[5, 7, 9, 11, 2, 0], [3, 4, 8, 1, 1, 1]], dtype=np.int64)


def outputs(model):
    model.eval()
    out = model(paddle.to_tensor(INPUT_IDS), attention_mask=paddle.to_tensor(
        (INPUT_IDS != 1).astype("float32")))
    return [t.numpy() for t in out if isinstance(t, paddle.Tensor)]


def assert_outputs_equal(a, b):
    oa, ob = outputs(a), outputs(b)
    assert len(oa) == len(ob) >= 2
    for x, y in zip(oa, ob):
        assert np.array_equal(x, y)


# == LoDTensor files ==============================================================================
@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    (np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 3).astype(np.float16),
    np.array([-(2 ** 40), -1, 0, 5, 2 ** 62], dtype=np.int64),
    np.arange(300, dtype=np.float64).reshape(300, 1),  # a dim > 127: two-byte varint
    np.array([1, -2, 3], dtype=np.int32), np.array([True, False, True]),
    np.arange(6, dtype=np.uint8), np.array([-3, 4], dtype=np.int8),
    np.array([-300, 7], dtype=np.int16), np.zeros([0, 4], np.float32)],
    ids=["fp32-2d", "fp16-3d", "int64-1d", "fp64-long-dim", "int32", "bool", "uint8", "int8",
         "int16", "empty"])
def test_lodtensor_round_trip_bit_exact(tmp_path, array):
    path = tmp_path / "t"
    write_lodtensor(path, array)
    back = read_lodtensor(path, upcast=False)
    assert back.dtype == array.dtype and back.shape == array.shape
    assert back.tobytes() == array.tobytes()
    assert os.listdir(tmp_path) == ["t"]  # the atomic write left no temp file


def test_fp16_is_upcast_by_default(tmp_path):
    half = np.array([[0.1, -2.5], [65504, 6e-8]], np.float16)
    write_lodtensor(tmp_path / "h", half)
    got = read_lodtensor(tmp_path / "h")
    assert got.dtype == np.float32 and np.array_equal(got, half.astype(np.float32))


def test_golden_header_bytes(tmp_path):
    # uint32 version 0 | uint64 lod_level 0 | uint32 version 0 | int32 desc length 6 |
    # desc 08 05 (data_type FP32) 10 02 10 03 (dims 2, 3 unpacked) | data.
    # These bytes equal a file paddle 2.6.2's save_vars wrote for the same tensor.
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    write_lodtensor(tmp_path / "w", array)
    raw = (tmp_path / "w").read_bytes()
    assert raw[:26].hex() == ("00000000" "0000000000000000" "00000000" "06000000"
                              "080510021003")
    assert raw[26:] == array.tobytes() and len(raw) == 26 + 24
    write_lodtensor(tmp_path / "i", np.array([7], np.int64))
    assert (tmp_path / "i").read_bytes().hex() == (
        "00000000" "0000000000000000" "00000000" "04000000" "08031001" "0700000000000000")


def _varint(v):
    out = b""
    while True:
        b, v = v & 0x7F, v >> 7
        out += bytes([b | 0x80 if v else b])
        if not v:
            return out


def test_hand_built_files_from_the_spec(tmp_path):
    # lod_level 1 with 3 offsets; TensorDesc with packed dims, an unknown field and dims > 127.
    values = np.arange(2 * 130, dtype=np.float16).reshape(2, 130)
    packed = _varint(2) + _varint(130)
    desc = (b"\x08" + _varint(4) + b"\x12" + _varint(len(packed)) + packed
            + b"\x18" + _varint(99))  # field 3 (unknown) must be skipped
    offsets = np.array([0, 1, 2], "<u8").tobytes()
    raw = (struct.pack("<IQ", 0, 1) + struct.pack("<Q", len(offsets)) + offsets
           + struct.pack("<Ii", 0, len(desc)) + desc + values.astype("<f2").tobytes())
    (tmp_path / "a").write_bytes(raw)
    got = read_lodtensor(tmp_path / "a")
    assert got.dtype == np.float32 and got.shape == (2, 130)
    assert np.array_equal(got, values.astype(np.float32))

    # BF16 (enum 22): 1.0 = 0x3F80, -2.0 = 0xC000, upcast exactly.
    desc = b"\x08" + _varint(22) + b"\x10\x02"
    raw = struct.pack("<IQIi", 0, 0, 0, len(desc)) + desc + np.array([0x3F80, 0xC000],
                                                                       "<u2").tobytes()
    (tmp_path / "b").write_bytes(raw)
    assert read_lodtensor(tmp_path / "b").tolist() == [1.0, -2.0]
    assert read_lodtensor(tmp_path / "b", upcast=False).tolist() == [0x3F80, 0xC000]


def _good_file(tmp_path):
    write_lodtensor(tmp_path / "good", np.ones([4, 4], np.float32))
    return (tmp_path / "good").read_bytes()


@pytest.mark.parametrize("mutate,needle", [
    (lambda raw: raw[:10], "truncated"),
    (lambda raw: raw[:28], "truncated"),
    (lambda raw: raw[:-1], "needs 64 data bytes, found 63"),
    (lambda raw: raw + b"\0", "1 bytes after"),
    (lambda raw: b"\x01" + raw[1:], "version 1"),
    (lambda raw: raw[:16] + b"\xff\xff\xff\x7f" + raw[20:], "TensorDesc length"),
    (lambda raw: raw[:20] + b"\x08\x63" + raw[22:], "unsupported data_type 99"),
    (lambda raw: raw[:20] + b"\x08\x05\x10\x04\x10\x84" + raw[26:], "varint runs past"),
    (lambda raw: raw[:20] + b"\x08\x05\x10\x04\x10\x03" + raw[26:],
     "16 bytes after the FP32 [4, 3] data"),
])
def test_corrupt_files_give_clear_errors(tmp_path, mutate, needle):
    bad = tmp_path / "bad_param"
    bad.write_bytes(mutate(_good_file(tmp_path)))
    with pytest.raises(LoDTensorFormatError) as e:
        read_lodtensor(bad)
    assert str(bad) in str(e.value) and needle in str(e.value)


def test_read_official_dir_params_nesting_and_skips(tmp_path):
    cfg = tiny()
    root, arrays = make_official(str(tmp_path / "ck"), cfg)
    (tmp_path / "ck" / "params" / ".hidden").write_bytes(b"\0" * 40)
    (tmp_path / "ck" / "params" / "notes.txt").write_text("not a tensor")
    for where in (root, os.path.join(root, "params")):
        got = lodtensor.read_official_dir(where)
        assert set(got) == set(arrays) | set(OPTIMIZER_FILES)
        assert all(np.array_equal(got[n], arrays[n]) for n in arrays)
    out = tmp_path / "out"
    lodtensor.write_official_dir(out, {"a": arrays["word_embedding"]})
    assert np.array_equal(lodtensor.read_official_dir(out)["a"], arrays["word_embedding"])


def _core_io():
    core = paddle.base.core if hasattr(paddle, "base") else paddle.fluid.core
    tensor = getattr(core, "LoDTensor", None) or core.DenseTensor
    save = getattr(core, "save_lod_tensor", None) or core.save_dense_tensor
    load = getattr(core, "load_lod_tensor", None) or core.load_dense_tensor
    return tensor, save, load


@pytest.mark.parametrize("array", [np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5,
                                   np.arange(10, dtype=np.float16).reshape(2, 5),
                                   np.array([3, -1, 2 ** 40], np.int64),
                                   np.array([True, False])], ids=["fp32", "fp16", "int64", "bool"])
def test_bytes_equal_paddles_own_serializer(tmp_path, array):
    """Paddle's C++ serializer (the one save_vars uses) and ours write the same bytes, and
    each reads the other's file exactly (both paddle versions)."""
    tensor_cls, save, load = _core_io()
    t = tensor_cls()
    t.set(array, paddle.CPUPlace())
    save(t, str(tmp_path / "paddle"))
    write_lodtensor(tmp_path / "ours", array)
    assert (tmp_path / "paddle").read_bytes() == (tmp_path / "ours").read_bytes()
    got = read_lodtensor(tmp_path / "paddle", upcast=False)
    assert got.dtype == array.dtype and np.array_equal(got, array)
    back = tensor_cls()
    load(back, str(tmp_path / "ours"))
    assert np.array_equal(np.array(back), array)


@pytest.mark.skipif(not PADDLE_2, reason="paddle 3.x load_program_state returns {} for "
                    "one-file-per-variable directories; cross-check on 2.x")
def test_paddle2_static_save_vars_and_load_program_state(tmp_path):
    arrays = {"word_embedding": np.random.default_rng(1).standard_normal([6, 4]).astype("f4"),
              "cls_out_b": np.array([1.5, -2], np.float32),
              "step": np.array([3], np.int64)}
    lodtensor.write_official_dir(tmp_path / "ours", arrays)
    loaded = paddle.static.load_program_state(str(tmp_path / "ours"))
    assert set(loaded) == set(arrays)
    for k in arrays:
        assert loaded[k].dtype == arrays[k].dtype and np.array_equal(loaded[k], arrays[k])

    paddle.enable_static()
    try:
        main, start = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, start):
            w = paddle.static.create_parameter([3, 5], "float32", name="w_a")
            h = paddle.static.create_parameter([4], "float16", name="h_b")
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(start)
        scope = paddle.static.global_scope()
        want = {"w_a": np.arange(15, dtype=np.float32).reshape(3, 5) / 3,
                "h_b": np.array([0.5, -1, 2, 1e-3], np.float16)}
        for name, value in want.items():
            scope.find_var(name).get_tensor().set(value, paddle.CPUPlace())
        paddle.static.save_vars(exe, str(tmp_path / "paddle"), main, vars=[w, h])
    finally:
        paddle.disable_static()
    got = lodtensor.read_official_dir(tmp_path / "paddle")
    assert np.array_equal(got["w_a"], want["w_a"])
    assert got["h_b"].dtype == np.float32 and np.array_equal(got["h_b"],
                                                             want["h_b"].astype(np.float32))


# == the name map ================================================================================
def test_large_en_name_map_covers_all_24_layers():
    large = ErnieDocConfig.from_preset("ernie-doc-large-en")
    expected = [n for n, _, _ in official_table(large)]
    assert len(expected) == 24 * 23 + 11
    assert sorted(names.expected_backbone_names(large)) == sorted(expected)
    # A model with the large-en layer count (tiny width): every key has its official name.
    model = ErnieDocModel(tiny(num_hidden_layers=large.num_hidden_layers))
    mapping = names.official_name_map(model.state_dict().keys())
    assert sorted(mapping.values()) == sorted(expected)
    table = {ours: off for off, _, ours in official_table(large)}
    assert mapping == {k: table[k] for k in mapping}
    for key, official in mapping.items():
        assert names.official_to_ours(official) == key


def test_shared_biases_and_head_names_map():
    shared = tiny(rel_pos_params_sharing=True)
    model = ErnieDocModel(shared)
    mapping = names.official_name_map(model.state_dict().keys())
    assert {"encoder_r_w_bias", "encoder_r_r_bias", "encoder_r_t_bias"} <= set(mapping.values())
    assert not any("multi_head_att_r_w_bias" in n for n in mapping.values())
    assert sorted(mapping.values()) == sorted(names.expected_backbone_names(shared))
    for head, cls in HEADS.items():
        keys = cls(tiny()).state_dict().keys()
        mapping = names.official_name_map(keys, cls.official_names, prefixed=True)
        assert set(cls.official_names.values()) <= set(mapping.values()), head
        assert all(k.startswith("ernie_doc.") or k in cls.official_names for k in mapping)


def test_encoder_gaps_from_the_config_else_the_tensors(tmp_path):
    """What a checkpoint must hold is checkpoint/'s: the official encoder names it lacks, its
    layer count and bias layout from its config, else guessed from its own tensors."""
    config = tiny(rel_pos_params_sharing=True)
    full = {n: np.zeros(1, np.float32) for n in names.expected_backbone_names(config)}
    assert io.encoder_gaps(io.Checkpoint("official", "x", full, config.to_dict())) == []
    first = names.expected_backbone_names(config)[0]
    partial = {n: a for n, a in full.items() if n not in (first, "encoder_r_w_bias")}
    gaps = [first, "encoder_r_w_bias"]
    assert io.encoder_gaps(io.Checkpoint("official", "x", partial)) == gaps   # shared: guessed
    ours = {"ernie_doc." + names.official_to_backbone(n): a for n, a in partial.items()}
    assert io.encoder_gaps(io.Checkpoint("safetensors", "x", ours, config.to_dict())) == gaps
    assert io.write_config(tmp_path, "official", config) == io.OFFICIAL_CONFIG_FILE
    assert json.loads((tmp_path / io.OFFICIAL_CONFIG_FILE).read_text()) == \
        io.official_config_dict(config)
    assert io.write_config(tmp_path, "safetensors", "ernie-doc-base-en") == io.CONFIG_FILE
    assert json.loads((tmp_path / io.CONFIG_FILE).read_text()) == \
        ErnieDocConfig.from_preset("ernie-doc-base-en").to_dict()


def test_optimizer_state_names_are_ignored():
    for name in OPTIMIZER_FILES + ("encoder_layer_3_ffn_fc_0.w_0_moment1_0", "mean_0.tmp_0"):
        assert names.is_ignored_official(name), name
    for name, _, _ in official_table(tiny(), "pretraining", shared=True):
        assert not names.is_ignored_official(name), name


# == loading the three layouts ====================================================================
def _expected_state(cfg, head, arrays, shared=False):
    prefix = "" if head is None else "ernie_doc."
    out = {}
    for off, _, ours in official_table(cfg, head, shared):
        is_head = ours.startswith(("linear.", "lm_head.", "reorder_head."))
        out[ours if is_head else prefix + ours] = arrays[off]
    return out


@pytest.mark.parametrize("head", [None, "cls", "pretraining"])
def test_official_load_and_every_conversion_path(tmp_path, head):
    cfg = tiny()
    cls = HEAD_CLASS[head]
    root, arrays = make_official(str(tmp_path / "official"), cfg, head)
    a = cls.from_pretrained(root)
    rep = a.load_report
    assert rep.format == "official" and rep.missing == [] and rep.unexpected == []
    assert sorted(rep.ignored) == sorted(OPTIMIZER_FILES)
    assert rep.config_source.endswith("ernie_config.json")
    got = state(a)
    want = _expected_state(cfg, head, arrays)
    assert set(got) == set(want)
    for k in want:
        assert np.array_equal(got[k], want[k]), k
    if head == "cls":
        assert a.num_labels == NUM_LABELS  # taken from cls_out_b
    assert auto.model_class_for(io.read_checkpoint(root)) is cls

    # official → ours → official: the written files are byte-identical to the originals.
    a.save_pretrained(tmp_path / "ours")
    b = cls.from_pretrained(tmp_path / "ours")
    assert b.load_report.format == "safetensors" and not b.load_report.missing
    assert_state_equal(a, b)
    assert_outputs_equal(a, b)
    b.save_pretrained(tmp_path / "back", format="official")
    written = sorted(n for n in os.listdir(tmp_path / "back") if n != "ernie_config.json")
    assert written == sorted(arrays)
    for name in arrays:
        assert (tmp_path / "back" / name).read_bytes() == \
            (tmp_path / "official" / "params" / name).read_bytes(), name
    with open(tmp_path / "back" / "ernie_config.json") as f:
        written = json.load(f)
    # + the class saved (a key the official code never reads): it tells cls_out_* heads apart
    assert written.pop("architecture")["class"] == type(b).__name__
    assert written == official_config_json(cfg)

    # official → PaddleNLP (keys: PaddleNLP's, heads prefixed), then PaddleNLP → ours.
    a.save_pretrained(tmp_path / "pn", format="paddlenlp")
    raw = paddle.load(str(tmp_path / "pn" / "model_state.pdparams"))
    assert sorted(raw) == sorted(want)
    c = cls.from_pretrained(tmp_path / "pn")
    assert c.load_report.format == "paddlenlp" and not c.load_report.missing
    assert_state_equal(a, c)
    assert_outputs_equal(a, c)
    c.save_pretrained(tmp_path / "pn2ours", format="ours")
    d = cls.from_pretrained(tmp_path / "pn2ours")
    assert_state_equal(a, d)
    assert_outputs_equal(a, d)


def test_shared_biases_round_trip(tmp_path):
    cfg = tiny(rel_pos_params_sharing=True)
    root, arrays = make_official(str(tmp_path / "official"), cfg, shared=True, nested=False)
    # ernie_config.json has no rel_pos_params_sharing key: the names decide.
    a = ErnieDocModel.from_pretrained(root)
    assert a.config.rel_pos_params_sharing is True
    assert not a.load_report.missing and not a.load_report.unexpected
    assert np.array_equal(a.encoder.r_w_bias.numpy(), arrays["encoder_r_w_bias"])
    a.save_pretrained(tmp_path / "ours")
    b = ErnieDocModel.from_pretrained(tmp_path / "ours")
    assert b.config.rel_pos_params_sharing is True
    assert_state_equal(a, b)
    assert_outputs_equal(a, b)
    b.save_pretrained(tmp_path / "back", format="official")
    for name in arrays:
        assert (tmp_path / "back" / name).read_bytes() == (tmp_path / "official" / name) \
            .read_bytes()


@pytest.mark.parametrize("prefixed", [True, False])
@pytest.mark.parametrize("config_name", ["config.json", "model_config.json"])
def test_paddlenlp_layouts(tmp_path, prefixed, config_name):
    cfg = tiny()
    paddle.seed(3)
    src = ErnieDocForSequenceClassification(cfg, num_labels=NUM_LABELS)
    keys = {k: (k if prefixed or not k.startswith("ernie_doc.") else k[len("ernie_doc."):])
            for k in src.state_dict()}
    paddle.save({keys[k]: v for k, v in src.state_dict().items()},
                str(tmp_path / "model_state.pdparams"))
    base = {"num_hidden_layers": L, "num_attention_heads": 2, "hidden_size": H,
            "vocab_size": V, "max_position_embeddings": 16, "memory_len": 4,
            "attention_dropout_prob": 0.0, "hidden_dropout_prob": 0.0, "relu_dropout": 0.0,
            "hidden_act": "gelu", "task_type_vocab_size": 3, "epsilon": 1e-12,
            "normalize_before": False, "rel_pos_params_sharing": False,
            "initializer_range": 0.02, "pad_token_id": 1, "cls_token_idx": -1}
    if config_name == "config.json":  # PaddleNLP ≥ 2.5
        raw = dict(base, architectures=["ErnieDocForSequenceClassification"],
                   model_type="ernie_doc", paddlenlp_version=None,
                   id2label={str(i): f"LABEL_{i}" for i in range(NUM_LABELS)})
    else:  # PaddleNLP ≤ 2.4: encoder arguments nested under init_args
        raw = {"init_args": [dict(base, init_class="ErnieDocModel")],
               "init_class": "ErnieDocForSequenceClassification", "num_classes": NUM_LABELS}
    with open(tmp_path / config_name, "w") as f:
        json.dump(raw, f)
    ckpt = io.read_checkpoint(tmp_path)
    assert ckpt.format == "paddlenlp"
    assert auto.model_class_for(ckpt) is ErnieDocForSequenceClassification
    got = ErnieDocForSequenceClassification.from_pretrained(tmp_path)
    assert got.num_labels == NUM_LABELS and got.config.epsilon == 1e-12
    assert not got.load_report.missing and not got.load_report.unexpected
    assert_state_equal(src, got)
    bare = ErnieDocModel.from_pretrained(tmp_path)
    assert sorted(bare.load_report.unexpected) == ["linear.bias", "linear.weight"]
    assert_state_equal({k[len("ernie_doc."):]: v for k, v in state(src).items()
                        if k.startswith("ernie_doc.")}, bare)


def _paddlenlp():
    try:
        import paddlenlp.transformers as t
    except Exception as e:  # noqa: BLE001  an environment problem, not ours
        pytest.skip(f"paddlenlp does not import here: {type(e).__name__}: {e}")
    return t


def test_paddlenlp_reads_what_we_save(tmp_path):
    pnlp = _paddlenlp()
    cfg = tiny(epsilon=1e-12)
    paddle.seed(5)
    for ours_cls, their_cls, kw in (
            (ErnieDocModel, pnlp.ErnieDocModel, {}),
            (ErnieDocForSequenceClassification, pnlp.ErnieDocForSequenceClassification,
             {"num_labels": NUM_LABELS})):
        ours = ours_cls(cfg, **kw)
        out = tmp_path / ours_cls.__name__
        ours.save_pretrained(out, format="paddlenlp")
        theirs = their_cls.from_pretrained(str(out))
        assert theirs.config.epsilon == 1e-12 and theirs.config.attention_dropout_prob == 0.0
        assert theirs.config.num_hidden_layers == L and theirs.config.memory_len == 4
        if kw:
            assert theirs.config.num_labels == NUM_LABELS
        assert_state_equal(ours, theirs)  # same keys, order and values: nothing missing


def test_we_read_what_paddlenlp_saves(tmp_path):
    pnlp = _paddlenlp()
    paddle.seed(6)
    their_cfg = pnlp.ErnieDocConfig(num_labels=NUM_LABELS, **TINY)
    for their_cls, ours_cls in ((pnlp.ErnieDocForSequenceClassification,
                                 ErnieDocForSequenceClassification),
                                (pnlp.ErnieDocModel, ErnieDocModel)):
        theirs = their_cls(their_cfg)
        out = tmp_path / their_cls.__name__
        theirs.save_pretrained(str(out))
        ours = ours_cls.from_pretrained(out)
        rep = ours.load_report
        assert rep.format == "paddlenlp" and not rep.missing and not rep.unexpected
        assert ours.config.attention_probs_dropout_prob == their_cfg.attention_dropout_prob
        assert ours.config.epsilon == their_cfg.epsilon
        if ours_cls is ErnieDocForSequenceClassification:
            assert ours.num_labels == NUM_LABELS
        assert_state_equal(theirs, ours)


# == reports and errors ===========================================================================
def test_missing_head_keeps_init_and_unexpected_are_listed(tmp_path):
    cfg = tiny()
    root, arrays = make_official(str(tmp_path / "bb"), cfg)  # backbone only
    paddle.seed(11)
    fresh = ErnieDocForSequenceClassification(cfg, num_labels=4)
    paddle.seed(11)
    model = ErnieDocForSequenceClassification.from_pretrained(root, num_labels=4)
    assert model.load_report["missing"] == ["linear.weight", "linear.bias"]
    assert model.load_report.unexpected == []
    assert np.array_equal(model.linear.weight.numpy(), fresh.linear.weight.numpy())
    assert np.array_equal(model.ernie_doc.embeddings.word_emb.weight.numpy(),
                          arrays["word_embedding"])
    with pytest.raises(CheckpointError, match="strict"):
        ErnieDocForSequenceClassification.from_pretrained(root, num_labels=4, strict=True)

    root, _ = make_official(str(tmp_path / "pt"), cfg, "pretraining")
    write_lodtensor(os.path.join(root, "params", "mask_lm_out_fc.w_0"),
                    np.zeros([H, V], np.float32))  # the untied MLM output variant
    write_lodtensor(os.path.join(root, "params", "cls_out_w"), np.zeros([H, 2], np.float32))
    pre = ErnieDocForPretraining.from_pretrained(root)
    assert sorted(pre.load_report.unexpected) == ["cls_out_w", "mask_lm_out_fc.w_0"]
    assert pre.load_report.missing == []
    bare = ErnieDocModel.from_pretrained(root)
    assert "mask_lm_trans_fc.w_0" in bare.load_report.unexpected


def test_shape_mismatch_names_tensor_and_both_shapes(tmp_path):
    root, _ = make_official(str(tmp_path / "c"), tiny(), "cls")
    with pytest.raises(CheckpointError) as e:   # a ValueError: one line for the CLIs
        ErnieDocForSequenceClassification.from_pretrained(root, num_labels=5)
    msg = str(e.value)
    assert "cls_out_w" in msg and "[32, 3]" in msg and "[32, 5]" in msg and "cls_out_b" in msg
    assert "\n" not in msg
    with pytest.raises(ValueError, match=r"word_embedding.*\[60, 32\] vs model \[70, 32\]"):
        ErnieDocModel.from_pretrained(root, vocab_size=70)


def test_unrecognisable_directory_and_missing_config(tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "readme.txt").write_text("hi")
    with pytest.raises(CheckpointError) as e:
        ErnieDocModel.from_pretrained(tmp_path / "junk")
    msg = str(e.value)
    assert str(tmp_path / "junk") in msg
    for looked_for in ("model.safetensors", "model_state.pdparams", "word_embedding", "params/"):
        assert looked_for in msg
    with pytest.raises(CheckpointError, match="no such file"):
        ErnieDocModel.from_pretrained(tmp_path / "nowhere")

    root, arrays = make_official(str(tmp_path / "nocfg"), tiny(), nested=False)
    os.remove(os.path.join(root, "ernie_config.json"))
    with pytest.raises(CheckpointError, match="no config"):
        ErnieDocModel.from_pretrained(root)
    model = ErnieDocModel.from_pretrained(root, config=tiny(), recurrence="xl")
    assert model.config.recurrence == "xl" and not model.load_report.missing
    with pytest.raises(TypeError, match="num_chioces"):
        ErnieDocModel.from_pretrained(root, config=tiny(), num_chioces=3)


def test_fp16_official_files_are_upcast(tmp_path):
    root, arrays = make_official(str(tmp_path / "h"), tiny(), dtype=np.float16)
    model = ErnieDocModel.from_pretrained(root)
    w = model.embeddings.word_emb.weight
    assert w.dtype == paddle.float32
    assert np.array_equal(w.numpy(), arrays["word_embedding"].astype(np.float32))


def test_corrupt_official_file_is_named(tmp_path):
    root, _ = make_official(str(tmp_path / "x"), tiny())
    path = os.path.join(root, "params", "pooled_fc.w_0")
    with open(path, "r+b") as f:
        f.truncate(40)
    with pytest.raises(CheckpointError, match="pooled_fc.w_0.*truncated"):
        ErnieDocModel.from_pretrained(root)


def test_save_keeps_other_files_and_leaves_no_temp(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "vocab.txt").write_text("[CLS]\n")
    model = ErnieDocForPretraining(tiny())
    for fmt in ("safetensors", "paddlenlp", "official"):
        model.save_pretrained(out, format=fmt)
    listing = os.listdir(out)
    assert "vocab.txt" in listing and not any(n.startswith(".") for n in listing)
    assert {"model.safetensors", "config.json", "model_state.pdparams", "ernie_config.json",
            "word_embedding", "mask_lm_out_fc.b_0"} <= set(listing)
    # Several layouts side by side: ours is preferred (no pickle involved).
    assert io.detect_format(out)[0] == "safetensors"
    with open(out / "config.json") as f:
        meta = json.load(f)
    assert meta["architecture"]["class"] == "ErnieDocForPretraining"
    with pytest.raises(ValueError, match="unknown checkpoint format"):
        model.save_pretrained(out, format="onnx")


# == the command-line converter ===================================================================
def _convert(*args):
    return subprocess.run([sys.executable, os.path.join(REPO, "tools", "convert_checkpoint.py"),
                           *map(str, args)], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


def test_convert_cli_official_ours_official(tmp_path):
    root, arrays = make_official(str(tmp_path / "official"), tiny(), "cls")
    r = _convert(root, tmp_path / "ours", "--to", "ours")
    assert r.returncode == 0, r.stderr
    assert "ErnieDocForSequenceClassification" in r.stdout and "ignored 11" in r.stdout
    r = _convert(tmp_path / "ours", tmp_path / "back", "--to", "official")
    assert r.returncode == 0, r.stderr
    for name in arrays:
        assert (tmp_path / "back" / name).read_bytes() == \
            (tmp_path / "official" / "params" / name).read_bytes(), name
    assert sorted(os.listdir(tmp_path / "back")) == sorted(list(arrays) + ["ernie_config.json"])


def test_convert_cli_bad_path_one_line_error(tmp_path):
    r = _convert(tmp_path / "missing", tmp_path / "out", "--to", "ours")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "missing" in lines[0]
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


def test_config_key_policy(tmp_path):
    model = ErnieDocModel(tiny())
    model.save_pretrained(tmp_path / "ours")
    with open(tmp_path / "ours" / "config.json") as f:
        meta = json.load(f)
    assert meta["architecture"] == {"class": "ErnieDocModel", "kwargs": {}}
    # Our own config: a misspelt key is an error, not silently dropped.
    with open(tmp_path / "ours" / "config.json", "w") as f:
        json.dump(dict(meta, memroy_len=4), f)
    with pytest.raises(CheckpointError, match="memroy_len"):
        ErnieDocModel.from_pretrained(tmp_path / "ours")
    # Another tool's config (PaddleNLP marks its files with model_type): dropped with a warning.
    model.save_pretrained(tmp_path / "pn", format="paddlenlp")
    with open(tmp_path / "pn" / "config.json") as f:
        meta = json.load(f)
    assert meta["attention_dropout_prob"] == 0.0 and meta["model_type"] == "ernie_doc"
    with open(tmp_path / "pn" / "config.json", "w") as f:
        json.dump(dict(meta, some_future_key=1, classifier_dropout=None), f)
    got = ErnieDocModel.from_pretrained(tmp_path / "pn")
    assert got.config == model.config


def test_optimizer_state_moves_between_models_with_other_generated_names(tmp_path):
    """paddle names parameters by a per-process counter (linear_7.w_0); the saved optimizer
    state is keyed by structured names, so a model built after other layers still loads it."""
    import paddle

    from ernie_doc.training.state import load_optimizer_state, optimizer_state

    def build():
        paddle.seed(0)
        model = paddle.nn.Sequential(paddle.nn.Linear(3, 4), paddle.nn.Linear(4, 2))
        return model, paddle.optimizer.AdamW(parameters=model.parameters())

    a, opt_a = build()
    for _ in range(2):
        a(paddle.ones([2, 3])).sum().backward()
        opt_a.step()
        opt_a.clear_grad()
    paddle.save(optimizer_state(a, opt_a), str(tmp_path / "opt.pdopt"))
    state = paddle.load(str(tmp_path / "opt.pdopt"))
    paddle.nn.Linear(5, 5)   # moves the name counter on
    b, opt_b = build()
    assert [p.name for p in a.parameters()] != [p.name for p in b.parameters()]
    b.set_state_dict(a.state_dict())
    load_optimizer_state(b, opt_b, state)
    for model, opt in ((a, opt_a), (b, opt_b)):
        model(paddle.ones([2, 3])).sum().backward()
        opt.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        np.testing.assert_array_equal(pa.numpy(), pb.numpy())


# == heads of the registry beyond the official ones ================================================
def test_convert_pair_matching_every_layout(tmp_path):
    """ours → paddlenlp (class from the architecture) → official (cls_out_*) → ours again with
    --head pair_matching (an official directory does not say which head shares cls_out_*)."""
    from ernie_doc.cli import convert
    from ernie_doc.heads import ErnieDocForPairMatching
    paddle.seed(31)
    model = ErnieDocForPairMatching(tiny())
    model.save_pretrained(tmp_path / "ours")
    assert auto.model_class_for(io.read_checkpoint(tmp_path / "ours")) is ErnieDocForPairMatching
    assert convert.main([str(tmp_path / "ours"), str(tmp_path / "pn"), "--to", "paddlenlp",
                         "--quiet"]) == 0
    assert convert.main([str(tmp_path / "pn"), str(tmp_path / "off"), "--to", "official",
                         "--quiet"]) == 0
    assert {"cls_out_w", "cls_out_b"} <= set(os.listdir(tmp_path / "off"))
    # The official files record the class beside them (ernie_config.json's "architecture");
    # without it the shared official names read as classification, as before the registry.
    assert auto.model_class_for(io.read_checkpoint(tmp_path / "off")) is ErnieDocForPairMatching
    config = tmp_path / "off" / "ernie_config.json"
    config.write_text(json.dumps({k: v for k, v in json.loads(config.read_text()).items()
                                  if k != "architecture"}))
    assert auto.model_class_for(io.read_checkpoint(tmp_path / "off")) is \
        ErnieDocForSequenceClassification
    assert convert.main([str(tmp_path / "off"), str(tmp_path / "back"), "--to", "ours",
                         "--head", "pair_matching", "--strict", "--quiet"]) == 0
    back = ErnieDocForPairMatching.from_pretrained(tmp_path / "back", strict=True)
    assert_state_equal(model, back)


def test_convert_hotpotqa_head(tmp_path, capsys):
    """A task's own head (registered from tasks/hotpotqa/head.py) converts between our layout
    and PaddleNLP's, its stage kept; it has no official names, so an official target is a
    one-line error."""
    from ernie_doc.cli import convert
    from tasks.hotpotqa.head import ErnieDocForHotpotQA
    paddle.seed(33)
    model = ErnieDocForHotpotQA(tiny(), stage="evidence")
    model.save_pretrained(tmp_path / "ours")
    assert auto.model_class_for(io.read_checkpoint(tmp_path / "ours")) is ErnieDocForHotpotQA
    assert convert.main([str(tmp_path / "ours"), str(tmp_path / "pn"), "--to", "paddlenlp",
                         "--strict"]) == 0
    assert "ErnieDocForHotpotQA" in capsys.readouterr().out
    assert convert.main([str(tmp_path / "pn"), str(tmp_path / "back"), "--to", "ours",
                         "--head", "hotpotqa", "--strict", "--quiet"]) == 0
    back = ErnieDocForHotpotQA.from_pretrained(tmp_path / "back", strict=True)
    assert back.stage == "evidence" and back.load_report.format == "safetensors"
    assert_state_equal(model, back)
    capsys.readouterr()
    assert convert.main([str(tmp_path / "ours"), str(tmp_path / "off"), "--to", "official",
                         "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no official name for: para_scorer" in err[0]
    assert not (tmp_path / "off").exists()


def test_convert_head_choices_come_from_the_registry():
    from ernie_doc.cli import convert
    assert convert.parse_args(["a", "b", "--to", "ours", "--head", "hotpotqa"]).head == \
        "hotpotqa"
    with pytest.raises(SystemExit):
        convert.parse_args(["a", "b", "--to", "ours", "--head", "no_such_head"])
    assert set(auto.head_names()) >= set(HEADS) | {"pair_matching", "hotpotqa", "keyphrase"}


# Checkpoint safety (issue 13 §1, §3): a pickle payload in a checkpoint runs nowhere, damaged or
# mismatched weights are one-line errors, and real paddle.save files still load bit-exact through
# the restricted unpickler. Every fixture is written by the test.


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
