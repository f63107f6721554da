"""The one name map between official static names and ours (= PaddleNLP's bare-model names).

Both sides store Linear weights [in, out], so values need no transpose. Head models hold the
encoder under `ernie_doc.`; their own parameters map through the head class's `official_names`."""
import re
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Set

if TYPE_CHECKING:   # for the annotations only
    from ernie_doc.config import ErnieDocConfig

PREFIX = "ernie_doc."

# Backbone tensors outside the layers: ours → official.
GLOBAL_NAMES = {
    "embeddings.word_emb.weight": "word_embedding",
    "embeddings.pos_emb.weight": "pos_embedding",
    "embeddings.token_type_emb.weight": "task_embedding",
    "embeddings.norms.0.weight": "pre_encoder_emb_layer_norm_scale",
    "embeddings.norms.0.bias": "pre_encoder_emb_layer_norm_bias",
    "embeddings.norms.1.weight": "pre_encoder_r_pos_layer_norm_scale",
    "embeddings.norms.1.bias": "pre_encoder_r_pos_layer_norm_bias",
    "embeddings.norms.2.weight": "pre_encoder_r_task_layer_norm_scale",
    "embeddings.norms.2.bias": "pre_encoder_r_task_layer_norm_bias",
    "pooler.dense.weight": "pooled_fc.w_0",
    "pooler.dense.bias": "pooled_fc.b_0",
}
# rel_pos_params_sharing=True: one set of biases owned by the encoder.
SHARED_BIAS_NAMES = {
    "encoder.r_w_bias": "encoder_r_w_bias",
    "encoder.r_r_bias": "encoder_r_r_bias",
    "encoder.r_t_bias": "encoder_r_t_bias",
}
# Per layer i: ours "encoder.layers.{i}." + key → official "encoder_layer_{i}_" + value.
_ATT = "multi_head_att_"
LAYER_NAMES = {
    "attn.q_proj.weight": _ATT + "query_fc.w_0", "attn.q_proj.bias": _ATT + "query_fc.b_0",
    "attn.k_proj.weight": _ATT + "key_fc.w_0", "attn.k_proj.bias": _ATT + "key_fc.b_0",
    "attn.v_proj.weight": _ATT + "value_fc.w_0", "attn.v_proj.bias": _ATT + "value_fc.b_0",
    "attn.r_proj.weight": _ATT + "pos_fc.w_0", "attn.r_proj.bias": _ATT + "pos_fc.b_0",
    "attn.t_proj.weight": _ATT + "task_fc.w_0", "attn.t_proj.bias": _ATT + "task_fc.b_0",
    "attn.out_proj.weight": _ATT + "output_fc.w_0", "attn.out_proj.bias": _ATT + "output_fc.b_0",
    "attn.r_w_bias": _ATT + "r_w_bias",
    "attn.r_r_bias": _ATT + "r_r_bias",
    "attn.r_t_bias": _ATT + "r_t_bias",
    "norm1.weight": "post_att_layer_norm_scale", "norm1.bias": "post_att_layer_norm_bias",
    "ffn.linear1.weight": "ffn_fc_0.w_0", "ffn.linear1.bias": "ffn_fc_0.b_0",
    "ffn.linear2.weight": "ffn_fc_1.w_0", "ffn.linear2.bias": "ffn_fc_1.b_0",
    "norm2.weight": "post_ffn_layer_norm_scale", "norm2.bias": "post_ffn_layer_norm_bias",
}
_PER_LAYER_BIASES = ("attn.r_w_bias", "attn.r_r_bias", "attn.r_t_bias")
# The official head parameters per official head: {our key: official name}. Head classes
# declare their `official_names` from these; loaders read these tables, needing no model class.
CLASSIFICATION_HEAD = {"linear.weight": "cls_out_w", "linear.bias": "cls_out_b"}
SPAN_HEAD = {"linear.weight": "cls_mrc_out_w", "linear.bias": "cls_mrc_out_b"}
SEQUENCE_LABELING_HEAD = {"linear.weight": "cls_seq_label_out_w",
                          "linear.bias": "cls_seq_label_out_b"}
PRETRAINING_HEAD = {
    "lm_head.transform.weight": "mask_lm_trans_fc.w_0",
    "lm_head.transform.bias": "mask_lm_trans_fc.b_0",
    "lm_head.layer_norm.weight": "mask_lm_trans_layer_norm_scale",
    "lm_head.layer_norm.bias": "mask_lm_trans_layer_norm_bias",
    "lm_head.decoder_bias": "mask_lm_out_fc.b_0",
    "reorder_head.weight": "multi_sent_sorted_fc.w_0",
    "reorder_head.bias": "multi_sent_sorted_fc.b_0",
}
OFFICIAL_HEADS = (CLASSIFICATION_HEAD, SPAN_HEAD, SEQUENCE_LABELING_HEAD, PRETRAINING_HEAD)
# Official head parameters no head class loads (the untied masked-LM output projection):
# counted as another head's tensors.
OTHER_OFFICIAL_HEAD_NAMES = ("mask_lm_out_fc.w_0",)
# The encoder's top-level modules (ErnieDocModel): a key under one of them that is no backbone
# parameter of ours belongs to no head.
ENCODER_MODULES = ("embeddings", "encoder", "pooler")
_LAYER_INV = {v: k for k, v in LAYER_NAMES.items()}
_GLOBAL_INV = {v: k for k, v in {**GLOBAL_NAMES, **SHARED_BIAS_NAMES}.items()}
_OURS_LAYER = re.compile(r"^encoder\.layers\.(\d+)\.(.+)$")
_OFFICIAL_LAYER = re.compile(r"^encoder_layer_(\d+)_(.+)$")

# Official persistables that are not model parameters (optimizer, LR, AMP state, fetch
# temporaries): listed as "ignored".
_IGNORED_PATTERNS = [re.compile(p) for p in (
    r".*_moment\d+_\d+$",
    r".*_beta\d+_pow_acc_\d+$",
    r".*_velocity_\d+$",
    r"^@LR_DECAY_COUNTER@$",
    r"^learning_rate(_.*)?$",
    r"^scheduled_learning_rate$",
    r".*\.master$",
    r"^loss_scaling.*",
    r"^num_good_steps.*",
    r"^num_bad_steps.*",
    r".*\.tmp_\d+$",
)]


def official_head_names(extra: Iterable[str] = ()) -> Set[str]:
    """Every official head parameter name (OFFICIAL_HEADS and OTHER_OFFICIAL_HEAD_NAMES), with
    `extra` (e.g. the official names of a head class declared elsewhere)."""
    out = set(OTHER_OFFICIAL_HEAD_NAMES).union(extra)
    for head in OFFICIAL_HEADS:
        out.update(head.values())
    return out


def official_head_modules() -> Set[str]:
    """The first components of our keys of the official heads' parameters (linear, lm_head,
    reorder_head): a checkpoint key under one of them is a known head's."""
    return {key.split(".")[0] for head in OFFICIAL_HEADS for key in head}


def is_ignored_official(name: str) -> bool:
    """True for optimizer / LR / loss-scaling state and temporaries (not parameters)."""
    return any(p.match(name) for p in _IGNORED_PATTERNS)


def strip_prefix(key: str) -> str:
    return key[len(PREFIX):] if key.startswith(PREFIX) else key


def backbone_to_official(key: str) -> Optional[str]:
    """Bare backbone key (no `ernie_doc.` prefix) → official name, or None."""
    if key in GLOBAL_NAMES:
        return GLOBAL_NAMES[key]
    if key in SHARED_BIAS_NAMES:
        return SHARED_BIAS_NAMES[key]
    m = _OURS_LAYER.match(key)
    if m and m.group(2) in LAYER_NAMES:
        return f"encoder_layer_{int(m.group(1))}_{LAYER_NAMES[m.group(2)]}"
    return None


def official_to_backbone(name: str) -> Optional[str]:
    """Official name → bare backbone key, or None if it is not a backbone parameter."""
    if name in _GLOBAL_INV:
        return _GLOBAL_INV[name]
    m = _OFFICIAL_LAYER.match(name)
    if m and m.group(2) in _LAYER_INV:
        return f"encoder.layers.{int(m.group(1))}.{_LAYER_INV[m.group(2)]}"
    return None


def ours_to_official(key: str, head_names: Optional[Dict[str, str]] = None,
                     prefixed: Optional[bool] = None) -> Optional[str]:
    """One of our state_dict keys → official name, or None. head_names: the head's
    `official_names`. prefixed: backbone keys carry `ernie_doc.` (None: either)."""
    head_names = head_names or {}
    if key in head_names:
        return head_names[key]
    if key.startswith(PREFIX):
        if prefixed is False:
            return None
        return backbone_to_official(key[len(PREFIX):])
    if prefixed:
        return None
    return backbone_to_official(key)


def official_to_ours(name: str, head_names: Optional[Dict[str, str]] = None,
                     prefixed: bool = False) -> Optional[str]:
    """Official name → our state_dict key (with `ernie_doc.` on backbone keys when
    prefixed), or None if the name is neither a backbone nor one of head_names' parameters."""
    for ours, official in (head_names or {}).items():
        if official == name:
            return ours
    key = official_to_backbone(name)
    if key is None:
        return None
    return PREFIX + key if prefixed else key


def official_name_map(keys: Iterable[str], head_names: Optional[Dict[str, str]] = None,
                      prefixed: bool = False) -> Dict[str, str]:
    """{our key: official name} for an iterable of state_dict keys; KeyError lists the keys
    that have no official name."""
    mapping, unknown = {}, []
    for key in keys:
        official = ours_to_official(key, head_names, prefixed)
        if official is None:
            unknown.append(key)
        else:
            mapping[key] = official
    if unknown:
        raise KeyError(f"no official name for: {', '.join(unknown)}")
    if len(set(mapping.values())) != len(mapping):
        raise KeyError("two keys map to the same official name")
    return mapping


def expected_backbone_names(config: "ErnieDocConfig") -> List[str]:
    """Official backbone names a checkpoint of `config` holds (pooler included), in order."""
    names = []
    for i in range(config.num_hidden_layers):
        for key, official in LAYER_NAMES.items():
            if config.rel_pos_params_sharing and key in _PER_LAYER_BIASES:
                continue
            names.append(f"encoder_layer_{i}_{official}")
    if config.rel_pos_params_sharing:
        names.extend(SHARED_BIAS_NAMES.values())
    names.extend(GLOBAL_NAMES.values())
    return names


def bias_layout(backbone_keys: Iterable[str]) -> Optional[str]:
    """'shared', 'per_layer' or None: which r_{w,r,t} bias layout a set of bare backbone keys
    holds (used to pick rel_pos_params_sharing when a config does not say)."""
    keys = set(backbone_keys)
    shared = any(k in keys for k in SHARED_BIAS_NAMES)
    per_layer = any(_OURS_LAYER.match(k) and _OURS_LAYER.match(k).group(2) in _PER_LAYER_BIASES
                    for k in keys)
    if shared and not per_layer:
        return "shared"
    if per_layer and not shared:
        return "per_layer"
    return None
