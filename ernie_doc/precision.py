"""Mixed precision (`amp:`): which autocast a run uses, decided once from the config value,
the device and `compile`.

    amp: false   fp32 everywhere (the default); amp: true is fp16
    amp: fp16    GPU: float16 autocast (paddle's O1 lists) with dynamic loss scaling
    amp: bf16    GPU: bfloat16 autocast; CPU: bf16 matmuls in the compiled step (compile: true)

Unsupported cases are refused with the reason. Details: docs/design-notes.md, "Training:
mixed precision"."""
import contextlib
from typing import NamedTuple, Optional, Tuple, Union

import paddle

from ernie_doc.errors import ConfigError

AMP_VALUES = (False, True, "fp16", "bf16")


class AmpSettings(NamedTuple):
    """enabled · dtype: "float16" / "bfloat16" · loss_scaling: dynamic (fp16 only) ·
    in_program: autocast inside the compiled training step only (CPU bf16)."""
    enabled: bool = False
    dtype: str = "float16"
    loss_scaling: bool = False
    in_program: bool = False

    def autocast(self):
        """The context every dygraph forward of the run enters (training and evaluation);
        none without autocast (paddle's disabled one still costs a tenth of a millisecond a
        step, a tenth of a tiny model's streamed segment)."""
        if self.in_program or not self.enabled:
            return contextlib.nullcontext()
        return paddle.amp.auto_cast(enable=self.enabled, dtype=self.dtype)

    def program_autocast(self):
        """The context the compiled training step's traced forward enters."""
        if not self.in_program:
            return contextlib.nullcontext()
        return paddle.amp.auto_cast(enable=True, dtype=self.dtype, level="O1")

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


def cpu_bf16_problem() -> Optional[str]:
    """None when this paddle and processor can train bf16 on CPU (compiled), else why not."""
    if not paddle.framework.use_pir_api():
        return (f"paddle {paddle.__version__} captures legacy programs, where autocast leaves "
                f"CPU matmuls in fp32 (CPU bf16 training needs paddle >= 3)")
    if not paddle.base.core.supports_bfloat16_fast_performance():
        # oneDNN would emulate bf16 there, slower than fp32
        return "this processor has no AVX512-BF16 instructions"
    return None


def amp_settings(value: Union[bool, str], device: str,
                 capability: Optional[Tuple[int, int]] = None,
                 compiled: bool = False) -> AmpSettings:
    """The autocast for config value `value` on `device` → AmpSettings. ValueError (the
    reason) for fp16 on CPU, unsupported CPU bf16, a GPU too old, an unknown value."""
    problem = check_amp_value(value)
    if problem:
        raise ConfigError(problem)
    if value is False:
        return AmpSettings()
    precision = "fp16" if value is True else value
    if device == "cpu" and precision == "bf16":
        problem = cpu_bf16_problem() or (
            None if compiled else "bf16 training on CPU runs inside the compiled training "
                                  "step: set compile: true (paddle's dygraph autocast does "
                                  "nothing on CPU)")
        if problem:
            raise ConfigError(f"{problem}; bf16 prediction: ernie-doc predict --precision bf16")
        return AmpSettings(True, "bfloat16", loss_scaling=False, in_program=True)
    if device != "gpu":
        raise ConfigError(f"{precision} training needs a GPU (device is {device}): paddle's "
                          f"autocast runs on GPU only and it has no CPU {precision} matmul "
                          f"kernels for training")
    needed = MIN_CAPABILITY[precision]
    if capability is not None and tuple(capability) < needed:
        raise ConfigError(f"{precision} training needs a GPU of compute capability "
                          f"{needed[0]}.{needed[1]} or newer, this one has "
                          f"{capability[0]}.{capability[1]}")
    if precision == "bf16":
        return AmpSettings(True, "bfloat16", loss_scaling=False)
    return AmpSettings(True, "float16", loss_scaling=True)
