"""Mixed precision (`amp:`): which autocast a run uses, decided once from the config value and
the device.

    amp: false   fp32 everywhere (the default)
    amp: true    the same as fp16 (the released pretraining configs' setting)
    amp: fp16    GPU: float16 autocast (paddle's O1 lists) with dynamic loss scaling
    amp: bf16    GPU: bfloat16 autocast, no loss scaling (bf16 has fp32's exponent range)

On CPU neither trains: paddle's dygraph autocast runs on GPU, XPU and custom devices only (on
CPU it warns and stays fp32), and paddle has no CPU bfloat16 kernel for matmul outside oneDNN
inference programs. So `amp` on CPU is refused with the reason, rather than run as an fp32 run
that calls itself bf16. bf16 on CPU is for prediction: `ernie-doc predict --precision bf16`
(oneDNN, on a processor with AVX512-BF16 or AMX). `test_amp.py` checks that paddle still
behaves so on CPU; when a paddle release trains bf16 there, that test says so.
"""
from typing import NamedTuple, Optional, Tuple, Union

import paddle

AMP_VALUES = (False, True, "fp16", "bf16")


class AmpSettings(NamedTuple):
    """enabled: autocast on · dtype: "float16" / "bfloat16" (paddle's names) · loss_scaling:
    dynamic loss scaling (fp16 only)."""
    enabled: bool = False
    dtype: str = "float16"
    loss_scaling: bool = False

    def autocast(self):
        """The context every forward of the run enters."""
        return paddle.amp.auto_cast(enable=self.enabled, dtype=self.dtype)

    def scaler(self):
        """A GradScaler for fp16, else None."""
        return paddle.amp.GradScaler(init_loss_scaling=32768) if self.loss_scaling else None


def check_amp_value(value: object) -> Union[str, None]:
    """None when `value` is one of AMP_VALUES, else what is wrong with it."""
    if any(value is v if isinstance(v, bool) else value == v for v in AMP_VALUES):
        return None
    return f"must be false, true, fp16 or bf16, got {value!r}"


# paddle's autocast quietly stays fp32 below these compute capabilities: refused instead
MIN_CAPABILITY = {"fp16": (7, 0), "bf16": (8, 0)}


def gpu_capability() -> Optional[Tuple[int, int]]:
    """(major, minor) of the current GPU, None when paddle cannot tell."""
    try:
        return tuple(paddle.device.cuda.get_device_capability())
    except Exception:   # a CPU build or no visible GPU
        return None


def amp_settings(value: Union[bool, str], device: str,
                 capability: Optional[Tuple[int, int]] = None) -> AmpSettings:
    """The autocast for config value `value` on `device` ("cpu" or "gpu"; `capability`: the
    GPU's compute capability where known) → AmpSettings. Raises ValueError (the reason,
    without the key) for amp on CPU, on a GPU too old for the precision, or a value not in
    AMP_VALUES."""
    problem = check_amp_value(value)
    if problem:
        raise ValueError(problem)
    if value is False:
        return AmpSettings()
    precision = "fp16" if value is True else value
    if device != "gpu":
        hint = (" (bf16 on this CPU serves prediction: ernie-doc predict --precision bf16)"
                if precision == "bf16" else "")
        raise ValueError(f"{precision} training needs a GPU (device is {device}): paddle's "
                         f"autocast runs on GPU only and it has no CPU {precision} matmul "
                         f"kernels for training{hint}")
    needed = MIN_CAPABILITY[precision]
    if capability is not None and tuple(capability) < needed:
        raise ValueError(f"{precision} training needs a GPU of compute capability "
                         f"{needed[0]}.{needed[1]} or newer, this one has "
                         f"{capability[0]}.{capability[1]}")
    if precision == "bf16":
        return AmpSettings(True, "bfloat16", loss_scaling=False)
    return AmpSettings(True, "float16", loss_scaling=True)
