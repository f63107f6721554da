"""A compiled training forward (`compile: true`): the model's training call captured once as a
static program with `paddle.jit.to_static`, then replayed every micro-step.

Why: dygraph's per-operator Python dispatch dominates small configs. Weights stay the model's
parameters and dropout draws dygraph's masks, so the loss curve equals dygraph's to rounding.
Details: docs/design-notes.md, "Training: the compiled step"."""
import contextlib
import inspect
import re
from typing import Any, Callable, ContextManager, Optional, Set

import paddle

from ernie_doc.errors import Bf16ProgramError
from ernie_doc.precision import AmpSettings
from ernie_doc.training.runlog import logger


class _FlatForward(paddle.nn.Layer):
    """The model's call with inputs as one list and dict, returning a flat list; the output
    types are recorded while tracing (`template`) and rebuilt around results."""

    def __init__(self, model: paddle.nn.Layer,
                 autocast: Callable[[], ContextManager] = contextlib.nullcontext):
        super().__init__()
        self.model = model
        self.autocast = autocast
        self.template = None

    def forward(self, args, kwargs, uniform_task_types):
        # The lines below run while tracing only. `uniform_task_types` is a Python bool, so
        # each value gets its own program.
        encoder = self.model if hasattr(self.model, "uniform_task_types") else \
            getattr(self.model, "ernie_doc", None)
        if encoder is not None:
            encoder.uniform_task_types = uniform_task_types
        try:
            with self.autocast():
                out = self.model(*args, **kwargs)
        finally:
            if encoder is not None:
                encoder.uniform_task_types = None
        self.template = paddle.utils.map_structure(lambda _: None, out)
        return paddle.utils.flatten(out)


class CompiledForward:
    """Called like `model`: the first call per input signature traces a program, later calls
    replay it. Used only for training micro-steps."""

    def __init__(self, model: paddle.nn.Layer, amp: Optional[AmpSettings] = None):
        self.model = model
        self.amp = amp or AmpSettings()
        # Serial execution: concurrent dropout operators would draw from the shared generator
        # in a varying order; in program order the masks are dygraph's (a process-wide flag).
        paddle.set_flags({"FLAGS_new_executor_serial_run": True})
        # A wrapper converted, not the model: converting the model would replace its
        # forward for evaluation and export too.
        self._flat = _FlatForward(model, self.amp.program_autocast)
        self._program = paddle.jit.to_static(self._flat.forward, full_graph=True)
        self._signature = inspect.signature(model.forward)
        self._checked: Set[int] = set()   # ids of the programs bf16_program_problem passed
        self.proven = False   # set by the trainer once a whole micro-step ran compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.model.training:
            # the program is traced once per input signature, not per mode: an evaluation
            # call would replay the training program (dropout on)
            raise RuntimeError("CompiledForward runs training steps; call the model itself "
                               "in eval mode")
        inputs = (list(args), dict(kwargs), self._uniform_task_types(args, kwargs))
        # Tracing draws from the random generator: restore it, so a resumed run equals an
        # uninterrupted one.
        state = paddle.get_rng_state()
        concrete, _ = self._program.get_concrete_program(*inputs)
        paddle.set_rng_state(state)
        if self.amp.in_program and id(concrete) not in self._checked:
            problem = bf16_program_problem(concrete.main_program)
            if problem:
                raise Bf16ProgramError(f"amp: bf16 on CPU: {problem}")
            self._checked.add(id(concrete))
        flat = self._program(*inputs)
        return paddle.utils.pack_sequence_as(self._flat.template, list(flat))

    def _uniform_task_types(self, args, kwargs) -> bool:
        """Whether each row has one task type (ErnieDocModel.uniform_task_types), from the
        token_type_ids argument of the model's forward; no such argument → True."""
        bound = self._signature.bind(*args, **kwargs).arguments
        types = bound.get("token_type_ids")
        if types is None:
            return True
        return bool((types == types[:, :1]).all())


def bf16_program_problem(program: Any) -> Optional[str]:
    """Why a captured training program must not run as CPU bf16, or None: no bfloat16 matmul,
    or one mixing inputs with and without gradient (paddle 3.3.1 oneDNN segfaults)."""
    found, one_sided = 0, 0
    for op in program.global_block().ops:
        if op.name() not in ("pd_op.matmul", "onednn_op.matmul"):
            continue
        inputs = op.operands_source()
        if not any(v.dtype == paddle.bfloat16 for v in inputs):
            continue
        found += 1
        frozen = [v.stop_gradient for v in inputs]
        one_sided += any(frozen) and not all(frozen)
    if not found:
        return (f"paddle {paddle.__version__} left every matmul of the compiled step in "
                f"float32")
    if one_sided:
        return (f"{one_sided} of the {found} bfloat16 matmuls of the compiled step multiply a "
                f"tensor that takes a gradient by one that does not (a frozen weight or a "
                f"fixed table); paddle's oneDNN bf16 matmul gradient crashes on those")
    return None


def compiled_or_none(model: paddle.nn.Layer, enabled: bool, world: int = 1,
                     amp: Optional[AmpSettings] = None) -> Optional[CompiledForward]:
    """The compiled forward of `model` when `enabled`, else None (the model is called
    itself). `amp`: the run's AmpSettings."""
    if not enabled:
        return None
    if world > 1:
        # DataParallel finds unused parameters by walking the graph of its own forward's
        # outputs; a program called beside it would leave its gradient all-reduce waiting.
        logger.warning(f"compile: not supported with {world} data-parallel ranks yet; "
                       f"training in dygraph")
        return None
    logger.info("compile: the training forward runs as a captured program "
                "(paddle.jit.to_static); evaluation stays dygraph")
    if amp is not None and amp.in_program:
        logger.info("amp: bf16 on CPU: the compiled step's matmuls run in bfloat16 (oneDNN), "
                    "weights and optimizer stay float32; evaluation runs in float32")
    return CompiledForward(model, amp)


def first_line(error: BaseException) -> str:
    """A one-line reason from a multi-line paddle error: the error its conversion wrapped,
    else the first line that is not a code location."""
    lines = [line.strip() for line in str(error).splitlines()]
    if lines and lines[0].startswith("In transformed code"):
        inner = [line for line in lines[1:] if re.match(r"[A-Za-z]+(Error|Exception): ", line)]
        if inner:
            return inner[-1][:300]
    for line in lines:
        if line and not line.startswith(("In user code", "File ", "---")):
            return f"{type(error).__name__}: {line}"[:300]
    return type(error).__name__


def try_compiled(step: Callable[[Any], Any], compiled: CompiledForward, fallback: Any,
                 undo: Callable[[], None]) -> Any:
    """Run `step(compiled)` → (result, the model callable to keep); a failing first step is
    logged, `undo` called and `step(fallback)` run, except CPU bf16: Bf16ProgramError."""
    if compiled.proven:
        return step(compiled), compiled
    try:
        result = step(compiled)
    except (KeyboardInterrupt, MemoryError, Bf16ProgramError):
        raise
    except Exception as error:   # a capture or program error: dygraph can still train
        if compiled.amp.in_program:
            raise Bf16ProgramError(f"amp: bf16 on CPU: the compiled step failed on paddle "
                                   f"{paddle.__version__} ({first_line(error)})") from error
        logger.warning(f"compile: the training step could not be captured on paddle "
                       f"{paddle.__version__} ({first_line(error)}); falling back to dygraph")
        undo()
        return step(fallback), fallback
    compiled.proven = True
    return result, compiled
