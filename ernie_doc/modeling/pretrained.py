"""from_pretrained / save_pretrained: the one door for weights.

    model = ErnieDocForSequenceClassification.from_pretrained(path, num_labels=3)
    model.load_report          # .missing / .unexpected / .ignored / .format / .path
    model.save_pretrained(out, format="safetensors" | "paddlenlp" | "official")

`path` may hold any layout of ernie_doc.checkpoint.io (official static files, PaddleNLP
.pdparams, ours). Names are mapped with ernie_doc.checkpoint.names; the model's own state_dict
keys are PaddleNLP's (heads keep the encoder under `ernie_doc.`).
"""
import inspect
import logging

import numpy as np

logger = logging.getLogger("ernie_doc.checkpoint")

# Constructor arguments that a checkpoint's head tensors fix: argument → (head key, axis).
_SIZE_FROM_CHECKPOINT = {"num_labels": ("linear.bias", 0),
                         "num_reorder_classes": ("reorder_head.bias", 0)}


class LoadReport:
    """What from_pretrained did. Lists hold checkpoint names (unexpected, ignored) or model
    keys (missing); also usable as a dict (report["missing"])."""

    def __init__(self, format, path, config_source, loaded, missing, unexpected, ignored):
        self.format = format
        self.path = path
        self.config_source = config_source
        self.loaded = loaded
        self.missing = missing
        self.unexpected = unexpected
        self.ignored = ignored

    def to_dict(self):
        return {"format": self.format, "path": self.path, "config_source": self.config_source,
                "loaded": list(self.loaded), "missing": list(self.missing),
                "unexpected": list(self.unexpected), "ignored": list(self.ignored)}

    def __getitem__(self, key):
        return self.to_dict()[key]

    def summary(self):
        lines = [f"loaded {len(self.loaded)} tensors from {self.path} ({self.format} format; "
                 f"config from {self.config_source})"]
        if self.missing:
            lines.append(f"missing {len(self.missing)} (kept their fresh initialisation): "
                         + ", ".join(self.missing))
        if self.unexpected:
            lines.append(f"unexpected {len(self.unexpected)} (not used): "
                         + ", ".join(self.unexpected))
        if self.ignored:
            lines.append(f"ignored {len(self.ignored)} optimizer/LR-state entries")
        return "\n".join(lines)

    __str__ = summary

    def __repr__(self):
        return (f"LoadReport(format={self.format!r}, loaded={len(self.loaded)}, "
                f"missing={self.missing}, unexpected={self.unexpected}, "
                f"ignored={len(self.ignored)})")


def _is_bare(cls):
    from ernie_doc.modeling.model import ErnieDocModel
    return issubclass(cls, ErnieDocModel)


def _constructor_params(cls):
    params = inspect.signature(cls.__init__).parameters
    return [p for p in params if p not in ("self", "config")
            and params[p].kind not in (inspect.Parameter.VAR_POSITIONAL,
                                       inspect.Parameter.VAR_KEYWORD)]


def _config_keys():
    from ernie_doc import config as config_module
    return set(config_module._DEFAULTS) | set(config_module._ALIASES)


def checkpoint_key_map(names_in_checkpoint, fmt, cls):
    """{checkpoint name: model key or None} for a model of class `cls`.

    Official names go through names.py (+ cls.official_names for the head); PaddleNLP / our
    names are model keys already, with or without the `ernie_doc.` prefix.
    """
    from ernie_doc.checkpoint import names
    prefixed = not _is_bare(cls)
    head_names = cls.official_names
    out = {}
    for name in names_in_checkpoint:
        if fmt == "official":
            out[name] = names.official_to_ours(name, head_names, prefixed)
            continue
        bare = names.strip_prefix(name)
        if names.backbone_to_official(bare) is not None:  # a backbone tensor
            out[name] = names.PREFIX + bare if prefixed else bare
        else:  # a head tensor: heads keep theirs unprefixed
            out[name] = None if name.startswith(names.PREFIX) else name
    return out


def _assign(param, array):
    """Copy ndarray `array` into `param`, cast to the parameter's dtype."""
    import paddle
    np_dtype = {paddle.float32: np.float32, paddle.float16: np.float16,
                paddle.float64: np.float64}.get(param.dtype)
    if np_dtype is not None:
        param.set_value(np.ascontiguousarray(array, dtype=np_dtype))
    else:  # e.g. bfloat16, which numpy cannot hold
        param.set_value(paddle.to_tensor(np.asarray(array, dtype=np.float32))
                        .astype(param.dtype))


class PretrainedMixin:
    """Adds from_pretrained / save_pretrained to ErnieDocModel and every head."""

    official_names = {}  # head classes: {their own parameter key: official static name}

    @classmethod
    def from_pretrained(cls, path, config=None, strict=False, **kwargs):
        """Build `cls` and load a checkpoint into it.

        path: a checkpoint directory or weights file of any supported layout (or an
            already read ernie_doc.checkpoint.io.Checkpoint).
        config: ErnieDocConfig, preset name, JSON path or dict. Wins over the checkpoint's
            config; required when the checkpoint has none.
        strict: raise if any model tensor is missing or any checkpoint tensor is unused.
        kwargs: config keys (e.g. recurrence="xl") override the config; constructor arguments
            (num_labels, num_choices, dropout, ...) go to the constructor. A head size that is
            not given (num_labels, num_reorder_classes) is taken from the checkpoint's tensor.

        Returns the model (mode unchanged: call .eval() for inference) with `.load_report`.
        Raises CheckpointError (no checkpoint / no config / strict violations), ValueError
        (shape mismatches, listing each tensor with both shapes).
        """
        from ernie_doc.checkpoint import io, names
        from ernie_doc.config import ErnieDocConfig

        ckpt = path if isinstance(path, io.Checkpoint) else io.read_checkpoint(path)
        where = ckpt.path

        ctor_params = _constructor_params(cls)
        config_keys = _config_keys()
        ctor_kwargs, overrides = {}, {}
        for key, value in kwargs.items():
            if key in ctor_params:
                ctor_kwargs[key] = value
            elif key in config_keys:
                overrides[key] = value
            else:
                raise TypeError(f"{cls.__name__}.from_pretrained: unknown argument {key!r} "
                                f"(neither a config key nor one of {ctor_params})")

        if config is not None:
            cfg = ErnieDocConfig.from_any(config)
            config_source = "the config argument"
            if ckpt.config is not None:
                logger.info("%s: using the given config instead of %s", where, ckpt.config_path)
        elif ckpt.config is not None:
            cfg = ErnieDocConfig.from_dict(ckpt.config, source=ckpt.config_path)
            config_source = ckpt.config_path
        else:
            raise io.CheckpointError(
                f"{where}: the checkpoint has no config file (looked for {io.CONFIG_FILE}, "
                f"{io.LEGACY_CONFIG_FILE} or {io.OFFICIAL_CONFIG_FILE}); pass config= (a preset "
                f"name, a JSON path or an ErnieDocConfig)")

        key_map = checkpoint_key_map(ckpt.tensors, ckpt.format, cls)

        # Official configs do not say whether the r_{w,r,t} biases are shared: the names do.
        if "rel_pos_params_sharing" not in overrides:
            layout = names.bias_layout(names.strip_prefix(k) for k in key_map.values() if k)
            if layout is not None and (layout == "shared") != cfg.rel_pos_params_sharing:
                logger.info("%s: the checkpoint holds %s r_w/r_r/r_t biases: setting "
                            "rel_pos_params_sharing=%s", where, layout.replace("_", "-"),
                            layout == "shared")
                overrides["rel_pos_params_sharing"] = layout == "shared"
        if overrides:
            cfg = cfg.replace(**overrides)

        # Head arguments: given > the checkpoint's tensors > our config's "architecture".
        for arg, (head_key, axis) in _SIZE_FROM_CHECKPOINT.items():
            if arg in ctor_params and arg not in ctor_kwargs:
                for name, key in key_map.items():
                    if key == head_key and ckpt.tensors[name].ndim > axis:
                        ctor_kwargs[arg] = int(ckpt.tensors[name].shape[axis])
        if ckpt.architecture:
            for key, value in ckpt.architecture.get("kwargs", {}).items():
                if key in ctor_params and key not in ctor_kwargs:
                    ctor_kwargs[key] = value

        model = cls(cfg, **ctor_kwargs)
        target = model.state_dict()

        assigned, unexpected, mismatched = {}, [], []
        for name, key in key_map.items():
            if key is None or key not in target or key in assigned:
                unexpected.append(name)
                continue
            want = [int(d) for d in target[key].shape]
            have = list(ckpt.tensors[name].shape)
            if want != have:
                label = name if name == key else f"{name} (model {key})"
                mismatched.append(f"{label}: checkpoint {have} vs model {want}")
                continue
            assigned[key] = name
        if mismatched:
            raise ValueError(f"{where}: {len(mismatched)} tensor shape(s) differ from the model "
                             f"(is the config right?):\n  " + "\n  ".join(mismatched))
        missing = [k for k in target if k not in assigned]
        if strict and (missing or unexpected):
            raise io.CheckpointError(
                f"{where}: strict load failed: missing {missing or 'none'}; "
                f"unexpected {unexpected or 'none'}")

        for key, name in assigned.items():
            _assign(target[key], ckpt.tensors[name])

        report = LoadReport(ckpt.format, where, config_source, sorted(assigned), missing,
                            unexpected, list(ckpt.ignored))
        model.load_report = report
        logger.info("%s", report.summary().splitlines()[0])
        if missing:
            logger.warning("%s: %d model tensors not in the checkpoint keep their fresh "
                           "initialisation: %s", where, len(missing), ", ".join(missing))
        if unexpected:
            logger.warning("%s: %d checkpoint tensors not used by %s: %s", where,
                           len(unexpected), cls.__name__, ", ".join(unexpected))
        if ckpt.ignored:
            logger.info("%s: ignored %d optimizer/LR-state entries", where, len(ckpt.ignored))
        return model

    def architecture(self):
        """{"class": class name, "kwargs": constructor arguments beyond the config}."""
        params = _constructor_params(type(self))
        kwargs = {}
        for name in ("num_labels", "num_choices"):
            if name in params and getattr(self, name, None) is not None:
                kwargs[name] = int(getattr(self, name))
        if "num_reorder_classes" in params and hasattr(self, "reorder_head"):
            kwargs["num_reorder_classes"] = int(self.reorder_head.weight.shape[1])
        dropout = getattr(self, "dropout", None)
        if "dropout" in params and hasattr(dropout, "p") and \
                float(dropout.p) != float(self.config.classifier_dropout):
            kwargs["dropout"] = float(dropout.p)
        return {"class": type(self).__name__, "kwargs": kwargs}

    def save_pretrained(self, directory, format="safetensors"):
        """Write the weights and config into `directory` (created if needed).

        format: "safetensors" (ours: model.safetensors + config.json), "paddlenlp"
        (model_state.pdparams with PaddleNLP keys + config.json) or "official" (one LoDTensor
        file per official name + ernie_config.json). All files appear together or not at all;
        other files in the directory (vocab, ...) are kept. Returns `directory`.
        """
        import paddle
        from ernie_doc.checkpoint import io, names

        fmt = io.normalize_format(format)
        state = self.state_dict()
        if fmt == "paddlenlp":
            tensors = dict(state)  # paddle.save takes the Tensors themselves
        else:
            tensors = {k: (v.astype("float32") if v.dtype == paddle.bfloat16 else v).numpy()
                       for k, v in state.items()}
        if fmt == "official":
            mapping = names.official_name_map(tensors, type(self).official_names,
                                              prefixed=not _is_bare(type(self)))
            tensors = {mapping[k]: v for k, v in tensors.items()}
        io.write_checkpoint(directory, fmt, tensors, self.config, self.architecture())
        return directory
