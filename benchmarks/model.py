#!/usr/bin/env python
"""CPU benchmark of ErnieDocModel: throughput against PaddleNLP, parity, and streaming.

    python tools/benchmark_model.py --preset ernie-doc-base-en --batch-size 2 --seq-len 512 \
        --memory-len 128 [--steps 3] [--warmup 1] [--threads N] [--no-paddlenlp] \
        [--stream-lengths 2048 32768] [--output results.json]
    python tools/benchmark_model.py --quick --output tmp.json      # small and fast, for tests

(From a source checkout; the pretraining runs are tools/benchmark_train.py.)

(a) forward tokens/s (eval, no_grad) and forward+backward tokens/s (train mode) of ours and of
    PaddleNLP 2.8.1's ErnieDocModel built with the same config and the SAME weights, the
    ratios, and the parity of the two (max abs diff of sequence, pooled and memories over two
    segments, the second one carrying each model's own memories). Our compiled training step
    (compile: true) is timed beside them, and in bf16 (amp: bf16) where the CPU and paddle
    can (amp.cpu_bf16_problem), with the ratios of each.
(b) streaming one document of each --stream-lengths tokens through our model segment by segment
    (eval, no_grad, carrying memories), each in a fresh subprocess so that its peak RSS is its
    own: wall time, time per segment and peak RSS, to show time linear and memory flat in
    document length. Memory flat is checked directly too (`memory_retention`): the bytes
    paddle's allocator holds for live tensors after n and after 2n segments, of the stream
    and of a forward + backward stream of the same segments, must be equal (the RSS of a
    small model is mostly the process itself, so its ratio could not show a leak).
(c) the CPU's matmul limits: numpy's sgemm (fp32) and, where bf16 can run, one bfloat16
    product in a captured program through oneDNN (AMX or AVX512-BF16), with each figure's
    share of the limit of its precision; and the per-segment overhead of a small model (the
    demo's L1 H64 encoder): its time per segment against the time of its matmul work.
(d) --threads N sets OMP_NUM_THREADS / MKL_NUM_THREADS before paddle is imported (paddle
    reads them at import; left unset, paddle itself sets OMP_NUM_THREADS=1) and calls
    paddle's set_num_threads where the version has it; the streaming subprocesses inherit it.

Inputs: random ids, attention_mask all ones and token_type_ids zeros, as in a plain document
stream; ours then skips the mask and the task term (its dygraph shortcuts), PaddleNLP computes
both. Ours runs as every ernie-doc command runs on CPU, with paddle's stride kernels off
(utils.set_device), PaddleNLP with paddle's default (on), as its scripts run. Prints one JSON
object (also written atomically to --output); exits with 1 when the parity check fails.
"""
import argparse
import functools
import json
import math
import os
import re
import resource
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Tuple

from benchmarks.common import (PACKAGE_PARENT, add_common_arguments, allocated_bytes,
                               apply_paddle_threads, check_output, emit, environment,
                               measure_retention, retention, set_threads)
from ernie_doc.cost import forward_matmul_flops  # no paddle at import: a count from the config

if TYPE_CHECKING:   # names for the hints only: paddle is imported after --threads is set
    import numpy as np
    import paddle

    from benchmarks.reference import PaddleNLPReference
    from ernie_doc import ErnieDocConfig, ErnieDocModel

QUICK = dict(preset="ernie-doc-small", batch_size=2, seq_len=128, memory_len=32, steps=1,
             warmup=1, repeats=1, stream_lengths=[512, 2048])
PARITY_TOL = 1e-5


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """This tool's own options (--threads and --output are benchmarks.common's)."""
    p.add_argument("--preset", default="ernie-doc-base-en")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--memory-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=3, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--repeats", type=int, default=3,
                   help="rounds of measurements, the models taking turns in each; the "
                        "reported tokens/s are the medians over the rounds")
    p.add_argument("--no-compile", action="store_true",
                   help="skip our compiled training step (compile: true)")
    p.add_argument("--no-bf16", action="store_true",
                   help="skip our compiled bf16 training step (amp: bf16, compile: true; run "
                        "only where the CPU and paddle can)")
    p.add_argument("--no-paddlenlp", action="store_true", help="skip the PaddleNLP baseline")
    p.add_argument("--profile", action="store_true",
                   help="also profile one forward+backward step of ours (dygraph, compiled, "
                        "compiled bf16): time per operator "
                        "family (matmul, softmax, layer norm, gather ...) and outside them")
    p.add_argument("--overhead-shape", type=int, nargs=3, default=[32, 8, 8],
                   metavar=("B", "T", "M"),
                   help="rows, segment and memory length of the per-segment overhead "
                        "measurement (an L1 H64 model, the offline demo's); default the demo's")
    p.add_argument("--overhead-threads", type=int, default=1,
                   help="paddle's threads for the overhead measurement (default 1, as the "
                        "demo trains; --threads is restored after)")
    p.add_argument("--no-overhead", action="store_true",
                   help="skip the per-segment overhead measurement")
    p.add_argument("--stream-lengths", type=int, nargs="*", default=[2048, 32768],
                   help="document lengths (tokens) to stream; none to skip")
    p.add_argument("--stream-batch-size", type=int, default=1,
                   help="documents streamed side by side (rows)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="ernie-doc-small, B=2, T=128, M=32, 1 step, lengths 512 and 2048")
    p.add_argument("--stream-worker", type=int, default=None, help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    add_common_arguments(p)
    return p


def given_on_command_line(build: Callable[[], argparse.ArgumentParser],
                          argv: Optional[List[str]]) -> set:
    """The option names (dests) the command line set itself, defaults left out; `build`
    makes the parser that reads it."""
    q = build()
    for action in q._actions:   # no defaults: the namespace holds only what was given
        action.default = argparse.SUPPRESS
    return set(vars(q.parse_args(argv)))


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace,
               argv: Optional[List[str]]) -> None:
    """--quick's settings (under what the command line gave itself), then the range checks;
    p.error (exit 2) on a bad value."""
    if args.quick:
        given = given_on_command_line(build_parser, argv)
        for key, value in QUICK.items():
            if key not in given:
                setattr(args, key, value)
    for name in ("batch_size", "seq_len", "steps", "stream_batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.memory_len < 0 or args.warmup < 0 or (args.threads is not None and args.threads < 1):
        p.error("--memory-len and --warmup must be >= 0, --threads >= 1")
    # before paddle is imported: more OpenMP threads than CPUs abort the process
    from ernie_doc.utils import threads_problem
    problem = None if args.threads is None else threads_problem(args.threads)
    if problem:
        p.error(f"--threads {problem}")
    if min(args.overhead_shape[:2]) < 1 or args.overhead_shape[2] < 0:
        p.error("--overhead-shape: B and T must be >= 1, M >= 0")
    problem = threads_problem(args.overhead_threads)
    if problem:
        p.error(f"--overhead-threads {problem}")
    if any(n < 1 for n in args.stream_lengths):
        p.error("--stream-lengths must be positive")
    check_output(p, args)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    check_args(p, args, argv)
    return args


def memory_kb() -> Tuple[Optional[int], int]:
    """(current RSS, peak RSS) of this process in kB."""
    cur = peak = None
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    cur = int(line.split()[1])
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1])
    except OSError:
        pass
    if peak is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux
    return cur, peak


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def mb(kb: Optional[float]) -> Optional[float]:
    return None if kb is None else round(kb / 1024.0, 1)


def build_config(args: argparse.Namespace) -> "ErnieDocConfig":
    """The preset's config with --memory-len; a bad --preset / --seq-len is ConfigError."""
    from ernie_doc import ErnieDocConfig
    from ernie_doc.errors import ConfigError
    try:
        config = ErnieDocConfig.from_preset(args.preset, memory_len=args.memory_len)
    except ConfigError as e:
        raise ConfigError(f"--preset {args.preset}: {e}") from None
    if args.seq_len > config.max_position_embeddings:
        raise ConfigError(f"--seq-len {args.seq_len} > max_position_embeddings "
                          f"{config.max_position_embeddings} of {args.preset}")
    return config


def check_memory(config: "ErnieDocConfig", args: argparse.Namespace) -> None:
    """Refuse (ConfigError naming the options) a benchmark whose memory estimate
    (ernie_doc.resources) exceeds what this machine has, before any tensor is made. The
    throughput rounds: forward + backward of --batch-size rows, with our model and
    PaddleNLP's copy of its weights (counted as training's weights, gradients and Adam
    moments: four copies of the weights). The stream: --stream-batch-size rows, no
    gradients, beside the whole document's ids and mask (12 bytes a token)."""
    from ernie_doc import ErnieDocModel, resources
    c = config
    params = resources.parameter_count(
        lambda n: ErnieDocModel(c.replace(num_hidden_layers=n)), c.num_hidden_layers)
    where = f"--preset {args.preset} ({params:,} parameters)"

    def parts(rows: int, training: bool) -> dict:
        return resources.training_parts(params, c.num_hidden_layers, rows, args.seq_len,
                                        args.memory_len, c.hidden_size,
                                        c.num_attention_heads, training=training)
    resources.check_fits(parts(args.batch_size, True),
                         f"{where}, --batch-size {args.batch_size}, --seq-len {args.seq_len}, "
                         f"--memory-len {args.memory_len}", "cpu")
    if args.stream_lengths:
        longest = max(math.ceil(n / args.seq_len) * args.seq_len for n in args.stream_lengths)
        stream = parts(args.stream_batch_size, False)
        stream["document"] = 12 * args.stream_batch_size * longest
        resources.check_fits(stream, f"{where}, --stream-batch-size {args.stream_batch_size}, "
                                     f"--stream-lengths up to {longest}", "cpu")


def build_ours(config: "ErnieDocConfig", seed: int) -> "ErnieDocModel":
    import paddle

    from ernie_doc import ErnieDocModel
    paddle.seed(seed)
    return ErnieDocModel(config)


def build_paddlenlp(ours: "ErnieDocModel") -> "PaddleNLPReference":
    """PaddleNLP's ErnieDocModel with our config and our weights (same state_dict names)."""
    from benchmarks.reference import PaddleNLPReference
    return PaddleNLPReference(ours)


class Inputs:
    """One batch in both calling conventions. ours: ids/types/mask [B,T], memories [L,B,M,H];
    PaddleNLP: ids/types/mask [B,T,1], position ids [B,2T+M,1], a list of L [B,M,H]."""

    def __init__(self, config: "ErnieDocConfig", batch: int, seq_len: int,
                 rng: "np.random.RandomState"):
        import numpy as np
        import paddle

        from benchmarks.reference import official_position_ids
        from ernie_doc.modeling.attention import relative_position_ids
        self.config = config
        ids = rng.randint(5, config.vocab_size, (batch, seq_len)).astype("int64")
        self.ids = paddle.to_tensor(ids)
        self.types = paddle.zeros([batch, seq_len], dtype="int64")
        self.mask = paddle.ones([batch, seq_len], dtype="float32")
        pos = relative_position_ids(seq_len, config.memory_len, config.max_position_embeddings,
                                    config.relative_position_mapping)
        # PaddleNLP is fed our table rows; at seq_len == max_position_embeddings they are its
        # own get_related_pos ids.
        self.pn_pos_equals_official = bool(np.array_equal(
            pos.numpy(), official_position_ids(seq_len, config.memory_len)))

    def run_ours(self, model: "ErnieDocModel", memories: Optional["paddle.Tensor"]) -> tuple:
        out = model(self.ids, memories, self.types, self.mask)
        return out.sequence_output, out.pooled_output, out.memories

    def run_paddlenlp(self, reference: "PaddleNLPReference",
                      memories: Optional["paddle.Tensor"]) -> tuple:
        return reference(self.ids, memories, self.types, self.mask)


def parity(config: "ErnieDocConfig", ours: "ErnieDocModel", pn: "PaddleNLPReference",
           batch: int, seq_len: int, rng: "np.random.RandomState") -> Dict[str, Any]:
    """Max abs diffs of ours vs PaddleNLP over two segments (eval, no_grad)."""
    import numpy as np
    import paddle
    ours.eval()
    pn.eval()
    diffs = {"sequence_output": 0.0, "pooled_output": 0.0, "memories": 0.0}
    mem_ours = mem_pn = ours.init_memories(batch)
    with paddle.no_grad():
        for _ in range(2):
            inputs = Inputs(config, batch, seq_len, rng)
            a = inputs.run_ours(ours, mem_ours)
            b = inputs.run_paddlenlp(pn, mem_pn)
            for name, x, y in zip(diffs, a, b):
                d = float(np.abs(x.numpy().astype("float64") - y.numpy()).max())
                diffs[name] = max(diffs[name], d)
            mem_ours, mem_pn = a[2], b[2]
    worst = max(diffs.values())
    return {"max_abs_diff": diffs, "max": worst, "tolerance": PARITY_TOL,
            "ok": worst <= PARITY_TOL, "segments": 2,
            "position_ids_equal_paddlenlp_recipe": inputs.pn_pos_equals_official}


def sgemm_gflops(size: int = 2048, repeats: int = 3) -> float:
    """This CPU's fp32 matrix multiply rate: numpy (OpenBLAS) float32 size³, best of
    `repeats`, in GFLOP/s, with the threads the benchmark set."""
    import numpy as np
    a = np.random.RandomState(0).standard_normal((size, size)).astype("float32")
    return product_gflops(lambda: a @ a, size, repeats)


def product_gflops(product: Callable[[], Any], size: int, repeats: int) -> float:
    """GFLOP/s of `product`, a size³ matrix product, best of `repeats` after one untimed call
    (it warms up the library's threads)."""
    best = min(time_steps(product, repeats, warmup=1))
    return 2 * size ** 3 / best / 1e9


def bf16_gflops(size: int = 2048, repeats: int = 3) -> float:
    """This CPU's bf16 matrix multiply rate through oneDNN (AMX or AVX512-BF16): a captured
    program holding one bfloat16 size³ product, best of `repeats`, in GFLOP/s. Only a corner
    of the product leaves the program, in float32 (paddle 3.3.1 crashes on a bfloat16 program
    output), so the time is the product's."""
    import numpy as np
    import paddle

    class OneProduct(paddle.nn.Layer):
        def forward(self, a, b):
            return paddle.matmul(a, b)[:1, :1].astype("float32")

    layer = OneProduct()
    program = paddle.jit.to_static(layer.forward, full_graph=True)
    a = paddle.to_tensor(np.random.RandomState(0).standard_normal((size, size))
                         .astype("float32")).astype("bfloat16")
    return product_gflops(lambda: float(program(a, a)), size, repeats)


def bf16_limit(config: "ErnieDocConfig", args: argparse.Namespace, tp: Dict[str, Any]
               ) -> Dict[str, Any]:
    """The tokens/s the bf16 matmul rate (bf16_gflops) would allow for the same matmul work
    as matmul_limit counts, and the compiled bf16 step's share of it; the reason instead
    where this paddle and CPU cannot run bf16 (precision.cpu_bf16_problem)."""
    from ernie_doc.precision import cpu_bf16_problem
    problem = cpu_bf16_problem()
    if problem:
        return {"skipped": problem}
    rate = bf16_gflops()
    _, limits = tokens_limits(config, args, rate)
    out = {"bf16_2048_gflops": round(rate, 1),
           "limit_tokens_per_s": {k: round(v, 1) for k, v in limits.items()}}
    if "ours_compiled_bf16" in tp:
        out["share_of_limit"] = limit_shares(tp, ["ours_compiled_bf16"], limits)
    return out


# the offline demo's encoder (tasks/longdep/config.yaml): L1 H64, dropout 0.1, 32 tokens
OVERHEAD_MODEL = dict(num_hidden_layers=1, hidden_size=64, num_attention_heads=4,
                      hidden_dropout_prob=0.1, vocab_size=32, pad_token_id=0)


def paddle_gemm_gflops(size: int = 2048, repeats: int = 3) -> float:
    """paddle's own fp32 matmul rate (dygraph, size³, best of `repeats`) with the threads
    paddle is set to now, in GFLOP/s."""
    import numpy as np
    import paddle
    a = paddle.to_tensor(np.random.RandomState(0).standard_normal((size, size))
                         .astype("float32"))
    return product_gflops(lambda: float(paddle.matmul(a, a)[0, 0]), size, repeats)


def segment_overhead(args: argparse.Namespace) -> Dict[str, Any]:
    """Time per segment of an L1 H64 model (OVERHEAD_MODEL) at --overhead-shape B T M with
    --overhead-threads (the demo trains with one), against the time its matmul work
    (forward_matmul_flops; 3x to train) takes at paddle's fp32 matmul rate with those threads:
    eval forward and dygraph forward + backward, and the compiled step (compile: true) unless
    --no-compile, medians of --repeats alternating rounds. What is above the matmul time is
    per-segment overhead: operator dispatch, small kernels, autograd. Leaves paddle at
    --threads where it was given."""
    apply_paddle_threads(args.overhead_threads)
    try:
        rate = paddle_gemm_gflops()
        result = {"threads": args.overhead_threads,
                  "paddle_gemm_2048_gflops": round(rate, 1)}
        return {**result, **overhead_rounds(args, rate)}
    finally:
        apply_paddle_threads(args.threads)


def overhead_rounds(args: argparse.Namespace, gemm_rate: float) -> Dict[str, Any]:
    """segment_overhead's measurement, with paddle's threads already set."""
    import numpy as np
    import paddle

    from ernie_doc import ErnieDocConfig
    batch, seq_len, memory_len = args.overhead_shape
    config = ErnieDocConfig.from_preset("ernie-doc-small", memory_len=memory_len,
                                        max_position_embeddings=max(seq_len, 8),
                                        **OVERHEAD_MODEL)
    model = build_ours(config, args.seed)
    inputs = Inputs(config, batch, seq_len, np.random.RandomState(args.seed))
    model.eval()
    with paddle.no_grad():
        memories = inputs.run_ours(model, model.init_memories(batch))[2]
    contenders = {"dygraph": dict(name="L1 H64 dygraph", model=model, run=inputs.run_ours)}
    if not args.no_compile:
        from ernie_doc.training.compiled import CompiledForward
        contenders["compiled"] = dict(name="L1 H64 compiled", model=model, run=inputs.run_ours,
                                      forward=False, call=CompiledForward(model))
    # a step takes milliseconds: enough of them to time
    timing = argparse.Namespace(**{**vars(args), "steps": max(args.steps, 20),
                                   "warmup": max(args.warmup, 3), "batch_size": batch,
                                   "seq_len": seq_len})
    tp = throughput(contenders, memories, timing)
    flops = forward_matmul_flops(config, batch, seq_len)
    matmul_s = {"forward": flops / (gemm_rate * 1e9),
                "forward_backward": 3 * flops / (gemm_rate * 1e9)}
    out: Dict[str, Any] = {"shape": {"layers": 1, "hidden_size": 64, "batch_size": batch,
                                     "seq_len": seq_len, "memory_len": memory_len},
                           "matmul_mflop_forward": round(flops / 1e6, 3),
                           "matmul_ms_at_gemm_rate": {k: round(v * 1e3, 4)
                                                       for k, v in matmul_s.items()}}
    for name, measured in tp.items():
        for key in matmul_s:
            if f"{key}_tokens_per_s" not in measured:
                continue
            tokens_per_s = measured[f"{key}_tokens_per_s"]   # the median round's
            ms = 1e3 * batch * seq_len / tokens_per_s
            out[f"{name}_{key}"] = {"ms_per_segment": round(ms, 3),
                                    "tokens_per_s": round(tokens_per_s, 1),
                                    "overhead_ms": round(ms - matmul_s[key] * 1e3, 3),
                                    "times_matmul": round(ms / (matmul_s[key] * 1e3), 1)}
    return out


def matmul_limit(config: "ErnieDocConfig", args: argparse.Namespace, tp: Dict[str, Any],
                 contenders: Iterable[str]) -> Dict[str, Any]:
    """The tokens/s this CPU's sgemm rate would allow if the model did only its necessary
    matmul work (tokens_limits), and the share of that limit of each of `contenders` (names
    in `tp`, throughput's result)."""
    rate = sgemm_gflops()
    per_token, limits = tokens_limits(config, args, rate)
    return {"sgemm_2048_gflops": round(rate, 1),
            "forward_mflop_per_token": round(per_token / 1e6, 1),
            "training_mflop_per_token": round(3 * per_token / 1e6, 1),
            "limit_tokens_per_s": {k: round(v, 1) for k, v in limits.items()},
            "share_of_limit": limit_shares(tp, contenders, limits)}


def tokens_limits(config: "ErnieDocConfig", args: argparse.Namespace, gflops: float
                  ) -> Tuple[float, Dict[str, float]]:
    """(matmul FLOPs per token forward, {measure: the tokens/s a matmul rate of `gflops`
    allows}): forward does forward_matmul_flops, training 3x (the backward needing two
    products per forward one)."""
    per_token = forward_matmul_flops(config, args.batch_size, args.seq_len) / (
        args.batch_size * args.seq_len)
    return per_token, {"forward_tokens_per_s": gflops * 1e9 / per_token,
                       "forward_backward_tokens_per_s": gflops * 1e9 / (3 * per_token)}


def limit_shares(tp: Dict[str, Any], names: Iterable[str], limits: Dict[str, float]
                 ) -> Dict[str, Dict[str, float]]:
    """Each of `names`' (throughput's result `tp`) tokens/s as a share of `limits`."""
    return {name: {key: round(tp[name][key] / limit, 3)
                   for key, limit in limits.items() if key in tp[name]}
            for name in names}


def time_steps(fn: Callable[[], Any], steps: int, warmup: int) -> List[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def train_step(model: Any, run: Callable[..., tuple], memories: Optional["paddle.Tensor"],
               call: Any = None) -> None:
    """One forward+backward of `model` (through `call`, default the model) on the batch
    `run` feeds it, gradients cleared after: what the throughput and the profile time."""
    seq, pooled, _ = run(call or model, memories)
    # the head's outputs, not the encoder's (see training/compiled.py on paddle 2.6.2)
    (seq.mean() + pooled.mean()).backward()
    model.clear_gradients()


def measure(name: str, model: Any, run: Callable[..., tuple], memories: Optional["paddle.Tensor"],
            args: argparse.Namespace, forward: bool = True, call: Any = None,
            strided: bool = False) -> Dict[str, List[float]]:
    """One round for one model → the step times of forward (eval, no_grad; skipped when not
    `forward`) and of forward+backward (train mode, through `call`, default the model).
    `strided`: with paddle's stride kernels on (its default, as PaddleNLP runs), else off
    (as every ernie-doc command runs on CPU: utils.set_device)."""
    import paddle
    call = call or model
    paddle.set_flags({"FLAGS_use_stride_kernel": strided})
    try:
        return _measure(name, model, run, memories, args, forward, call)
    finally:
        paddle.set_flags({"FLAGS_use_stride_kernel": False})


def _measure(name: str, model: Any, run: Callable[..., tuple],
             memories: Optional["paddle.Tensor"], args: argparse.Namespace, forward: bool,
             call: Any) -> Dict[str, List[float]]:
    import paddle

    def forward_only():
        with paddle.no_grad():
            out = run(call, memories)
        float(out[1].sum())  # make sure the work is done

    def forward_backward():
        train_step(model, run, memories, call)

    times = {}
    if forward:
        print(f"[benchmark] {name}: forward", file=sys.stderr, flush=True)
        model.eval()
        times["forward"] = time_steps(forward_only, args.steps, args.warmup)
    print(f"[benchmark] {name}: forward+backward", file=sys.stderr, flush=True)
    model.train()
    times["forward_backward"] = time_steps(forward_backward, args.steps, args.warmup)
    model.eval()
    return times


def summarize(rounds: List[Dict[str, List[float]]], tokens: int) -> Dict[str, Any]:
    """Per-round tokens/s and their median, for forward and forward+backward."""
    import statistics
    out = {}
    for key in rounds[0]:
        per_round = [round(tokens * len(t) / sum(t), 2) for t in (r[key] for r in rounds)]
        out[f"{key}_tokens_per_s"] = round(statistics.median(per_round), 2)
        out[f"{key}_tokens_per_s_rounds"] = per_round
        out[f"{key}_step_s"] = [round(t, 4) for r in rounds for t in r[key]]
    return out


def throughput(contenders: Dict[str, dict], memories: Optional["paddle.Tensor"],
               args: argparse.Namespace) -> Dict[str, Any]:
    """`args.repeats` rounds; in each, every contender (name → measure's keyword arguments)
    is measured in turn, so that a slow spell of a shared machine falls on all of them →
    {name: summarize(...)}."""
    rounds = {name: [] for name in contenders}
    for r in range(args.repeats):
        for name, kw in contenders.items():
            print(f"[benchmark] round {r + 1}/{args.repeats}", file=sys.stderr, flush=True)
            rounds[name].append(measure(memories=memories, args=args, **kw))
    tokens = args.batch_size * args.seq_len
    return {name: summarize(rs, tokens) for name, rs in rounds.items()}


# Operator families of the profile, matched against paddle's lower-cased operator names
# (forward "matmul dygraph" and backward "Global_MatmulGradNode" alike); the first pattern
# that matches names the family.
PROFILE_FAMILIES = (
    ("matmul", r"matmul|linear|gemm|bmm|einsum"),
    ("softmax", r"softmax"),
    ("layer norm", r"layer_?norm"),
    ("embedding", r"embedding"),
    ("gather / slice / concat", r"gather|index_select|take_along|slice|strided|split|concat|"
                                r"stack|pad"),
    ("reshape / transpose / expand", r"reshape|transpose|expand|squeeze|flatten|contiguous|"
                                     r"assign|copy"),
    ("dropout", r"dropout"),
    ("cast (fp32 <-> bf16)", r"\bcast"),   # not "broadcast"
    ("elementwise", r"add|subtract|multiply|divide|scale|gelu|relu|tanh|exp|where|full|"
                    r"fill|mean|sum|sqrt|pow|accumulation"),
)
# Events that wrap other operators' events (a compiled step's backward program, a PyLayer's
# backward such as add_broadcast's): left out, their inner operators count.
PROFILE_WRAPPERS = re.compile(r"dy2stgradnode|gradnodepylayer")


def operator_family(name: str) -> Optional[str]:
    """The PROFILE_FAMILIES family of a profiler event (the first pattern that matches its
    lower-cased name), "other operators", or None for a wrapper (PROFILE_WRAPPERS)."""
    name = name.lower()
    if PROFILE_WRAPPERS.search(name):
        return None
    return next((f for f, pattern in PROFILE_FAMILIES if re.search(pattern, name)),
                "other operators")


def profile_step(fn: Callable[[], Any]) -> Dict[str, Any]:
    """One call of `fn` (a forward+backward step, run once before for warm caches) under
    paddle's CPU profiler → seconds per operator family (PROFILE_FAMILIES, "other operators")
    and "outside operators" (the step's wall time minus its operators' time: Python, dispatch
    and autograd bookkeeping), with each one's share of the wall time."""

    import paddle.profiler as profiler
    from paddle.profiler.profiler_statistic import EventSummary
    fn()
    # on_trace_ready: no trace file (paddle would write ./profiler_log into the cwd)
    with profiler.Profiler(targets=[profiler.ProfilerTarget.CPU],
                           on_trace_ready=lambda p: None) as prof:
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
    summary = EventSummary()
    summary.parse(prof.profiler_result.get_data())
    seconds = {name: 0.0 for name, _ in PROFILE_FAMILIES}
    seconds["other operators"] = 0.0
    for name, item in summary.items.items():
        family = operator_family(name)
        if family is not None:
            seconds[family] += item.cpu_time / 1e9
    seconds["outside operators"] = max(0.0, wall - sum(seconds.values()))
    return {"wall_s": round(wall, 4),
            "seconds": {k: round(v, 4) for k, v in seconds.items()},
            "share": {k: round(v / wall, 4) for k, v in seconds.items()}}


# ---------------------------------------------------------------------------------------------
# streaming (one subprocess per document length)
# ---------------------------------------------------------------------------------------------
def stream_worker(args: argparse.Namespace) -> Dict[str, Any]:
    """Stream one document of args.stream_worker tokens; returns the result dict."""
    import numpy as np
    import paddle

    from ernie_doc.utils import set_device
    apply_paddle_threads(args.threads)
    set_device("cpu")
    config = build_config(args)
    model = build_ours(config, args.seed)
    model.eval()
    rss_model, _ = memory_kb()
    doc_len, batch, seg_len = args.stream_worker, args.stream_batch_size, args.seq_len
    n_seg = math.ceil(doc_len / seg_len)
    rng = np.random.RandomState(args.seed)
    # The document: ids of the real tokens, padded at the end of the last segment.
    doc = rng.randint(5, config.vocab_size, (batch, n_seg * seg_len)).astype("int64")
    valid = np.zeros((batch, n_seg * seg_len), "float32")
    valid[:, :doc_len] = 1.0
    doc[valid == 0] = config.pad_token_id
    types = paddle.zeros([batch, seg_len], dtype="int64")

    def segment(i):
        sl = slice(i * seg_len, (i + 1) * seg_len)
        return paddle.to_tensor(doc[:, sl]), paddle.to_tensor(valid[:, sl])

    times, rss_samples, allocated = [], [], []
    peak_reset = False
    memories = None
    t_start = time.perf_counter()
    with paddle.no_grad():
        for i in range(n_seg):
            ids, mask = segment(i)
            t0 = time.perf_counter()
            out = model(ids, memories, types, mask)
            memories = out.memories
            float(out.pooled_output.sum())
            times.append(time.perf_counter() - t0)
            allocated.append(allocated_bytes())
            if i == 0:
                # From here on only the steady state counts: allocator pools and oneDNN caches
                # are warm after the first segment.
                rss_first, peak_first = memory_kb()
                peak_reset = reset_peak_rss()
            if n_seg < 8 or i in {n_seg // 4, n_seg // 2, (3 * n_seg) // 4, n_seg - 1}:
                rss_samples.append({"segment": i + 1, "rss_mb": mb(memory_kb()[0])})
    wall = time.perf_counter() - t_start
    rss_end, peak_after_first = memory_kb()
    # training reads the same segments with gradients: forward + backward per segment, the
    # memories carried (a memory that kept its graph would retain every segment's)
    model.train()
    retained_train = measure_retention(train_segment_step(model, segment, types, n_seg),
                                       min(n_seg, TRAIN_RETENTION_SEGMENTS) // 2 or 1)
    half = max(1, len(times) // 2)
    steady = times[1:] or times
    return {
        "document_tokens": doc_len,
        "rows": batch,
        "segments": n_seg,
        "segment_len": seg_len,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(batch * doc_len / wall, 2),
        "first_segment_s": round(times[0], 4),
        "mean_segment_s_after_first": round(sum(steady) / len(steady), 4),
        "mean_segment_s_first_half": round(sum(times[:half]) / half, 4),
        "mean_segment_s_second_half": round(sum(times[half:]) / max(1, len(times) - half), 4)
        if len(times) > 1 else None,
        "rss_after_model_build_mb": mb(rss_model),
        "rss_after_first_segment_mb": mb(rss_first),
        "peak_rss_through_first_segment_mb": mb(peak_first),
        "peak_rss_after_first_segment_mb": mb(peak_after_first) if peak_reset else None,
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork+exec.
        "peak_rss_process_mb": mb(max(peak_first, peak_after_first)),
        "rss_end_mb": mb(rss_end),
        "rss_samples": rss_samples,
        # what the stream retains: allocated bytes after n and 2n segments (must not grow)
        "retained_eval": retention(allocated),
        "retained_train": retained_train,
    }


TRAIN_RETENTION_SEGMENTS = 8   # the train-mode retention check reads at most this many


def train_segment_step(model: "ErnieDocModel", segment: Callable[[int], tuple],
                       types: "paddle.Tensor", n_seg: int) -> Callable[[int], None]:
    """step(i): forward + backward of segment i (mod n_seg) in train mode, carrying the
    memories from the previous call, gradients cleared after (for `measure_retention`)."""
    state = {"memories": None}

    def step(i):
        ids, mask = segment(i % n_seg)
        out = model(ids, state["memories"], types, mask)
        state["memories"] = out.memories
        out.pooled_output.sum().backward()
        model.clear_gradients()

    return step


def run_stream_subprocess(args: argparse.Namespace, length: int) -> Dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.model",
           "--stream-worker", str(length),
           "--preset", args.preset, "--seq-len", str(args.seq_len),
           "--memory-len", str(args.memory_len), "--seed", str(args.seed),
           "--stream-batch-size", str(args.stream_batch_size)]
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env)
    if proc.returncode != 0:
        raise SystemExit(f"streaming {length} tokens failed (exit {proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise SystemExit(f"streaming {length} tokens printed no result:\n{proc.stdout[-2000:]}")
    return json.loads(lines[-1])




# ---------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    """The measurements of parsed `args` → the exit status."""
    set_threads(args.threads)
    if args.stream_worker is not None:
        print(json.dumps(stream_worker(args)), flush=True)
        return 0

    import numpy as np
    import paddle

    from ernie_doc.utils import set_device
    apply_paddle_threads(args.threads)
    set_device("cpu")   # ours as every ernie-doc command runs it: stride kernels off
    t_total = time.perf_counter()
    from ernie_doc.errors import ConfigError
    try:
        config = build_config(args)
        check_memory(config, args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = {
        "setup": {"preset": args.preset, "batch_size": args.batch_size, "seq_len": args.seq_len,
                  "memory_len": args.memory_len, "steps": args.steps, "warmup": args.warmup,
                  "quick": args.quick, "hidden_size": config.hidden_size,
                  "layers": config.num_hidden_layers, "vocab_size": config.vocab_size,
                  "inputs": "random ids, attention_mask all ones, token_type_ids zeros, "
                            "memories carried from a previous segment",
                  "stride_kernels": {"ours": False, "paddlenlp": True}},
        "environment": environment(args),
    }
    rng = np.random.RandomState(args.seed)
    ours = build_ours(config, args.seed)
    pn = None
    if not args.no_paddlenlp:
        print("[benchmark] building PaddleNLP baseline", file=sys.stderr, flush=True)
        pn = build_paddlenlp(ours)
        result["parity"] = parity(config, ours, pn, args.batch_size, args.seq_len, rng)

    inputs = Inputs(config, args.batch_size, args.seq_len, rng)
    # Memories as after one real segment (not zeros), the same for both models.
    with paddle.no_grad():
        ours.eval()
        memories = inputs.run_ours(ours, ours.init_memories(args.batch_size))[2]
    contenders = {"ours": dict(name="ours", model=ours, run=inputs.run_ours)}
    bf16_skipped = None
    if not args.no_compile:
        from ernie_doc.precision import amp_settings, cpu_bf16_problem
        from ernie_doc.training.compiled import CompiledForward
        contenders["ours_compiled"] = dict(name="ours compiled (compile: true)", model=ours,
                                           run=inputs.run_ours, forward=False,
                                           call=CompiledForward(ours))
        bf16_skipped = "--no-bf16" if args.no_bf16 else cpu_bf16_problem()
        if bf16_skipped is None:
            contenders["ours_compiled_bf16"] = dict(
                name="ours compiled bf16 (amp: bf16)", model=ours, run=inputs.run_ours,
                forward=False,
                call=CompiledForward(ours, amp_settings("bf16", "cpu", compiled=True)))
    if pn is not None:
        contenders["paddlenlp"] = dict(name="paddlenlp", model=pn, run=inputs.run_paddlenlp,
                                       strided=True)
    tp = throughput(contenders, memories, args)
    if pn is not None:
        tp["ratio_ours_over_paddlenlp"] = {
            key: round(tp["ours"][key] / tp["paddlenlp"][key], 3)
            for key in ("forward_tokens_per_s", "forward_backward_tokens_per_s")}
    if "ours_compiled" in tp:
        key = "forward_backward_tokens_per_s"
        tp["ratio_compiled_over_dygraph"] = {
            key: round(tp["ours_compiled"][key] / tp["ours"][key], 3)}
        if pn is not None:
            tp["ratio_ours_over_paddlenlp"]["compiled_forward_backward_tokens_per_s"] = round(
                tp["ours_compiled"][key] / tp["paddlenlp"][key], 3)
    if "ours_compiled_bf16" in tp:
        key = "forward_backward_tokens_per_s"
        tp["ratio_bf16_over_fp32_compiled"] = {
            key: round(tp["ours_compiled_bf16"][key] / tp["ours_compiled"][key], 3)}
    elif bf16_skipped is not None:
        tp["bf16_skipped"] = bf16_skipped
    result["throughput"] = tp
    result["matmul_limit"] = matmul_limit(config, args, tp, contenders)
    if not args.no_bf16:
        print("[benchmark] the bf16 matmul limit", file=sys.stderr, flush=True)
        result["bf16_limit"] = bf16_limit(config, args, tp)
    if args.profile:
        print("[benchmark] profiling one forward+backward step of ours", file=sys.stderr,
              flush=True)
        ours.train()

        result["profile"] = {
            name: profile_step(functools.partial(train_step, ours, inputs.run_ours, memories,
                                                 kw.get("call")))
            for name, kw in contenders.items() if name.startswith("ours")}
        ours.eval()
    if not args.no_overhead:
        # last: it sets paddle's threads (--overhead-threads)
        print("[benchmark] per-segment overhead (L1 H64)", file=sys.stderr, flush=True)
        result["segment_overhead"] = segment_overhead(args)
    result["main_process_peak_rss_mb"] = mb(memory_kb()[1])
    del ours, pn, inputs, memories

    streams = []
    for length in args.stream_lengths:
        print(f"[benchmark] streaming {length} tokens (subprocess)", file=sys.stderr, flush=True)
        streams.append(run_stream_subprocess(args, length))
    result["streaming"] = streams
    if len(streams) >= 2:
        a, b = streams[0], streams[-1]
        peak_key = ("peak_rss_after_first_segment_mb"
                    if a["peak_rss_after_first_segment_mb"] is not None
                    and b["peak_rss_after_first_segment_mb"] is not None
                    else "peak_rss_process_mb")
        result["streaming_summary"] = {
            "length_ratio": round(b["document_tokens"] / a["document_tokens"], 3),
            "wall_time_ratio": round(b["wall_s"] / a["wall_s"], 3),
            "peak_rss_key": peak_key,
            "peak_rss_ratio": round(b[peak_key] / a[peak_key], 3),
            "peak_rss_process_ratio": round(b["peak_rss_process_mb"] /
                                            a["peak_rss_process_mb"], 3),
        }
    if streams:
        # the direct check (the RSS ratio of a small model is dominated by the process
        # itself): allocated bytes after n and 2n segments, eval and train, every length
        growth = {str(s["document_tokens"]): {mode: s[f"retained_{mode}"].get("growth_bytes")
                                              for mode in ("eval", "train")} for s in streams}
        flags = [s[f"retained_{mode}"]["flat"] for s in streams for mode in ("eval", "train")]
        result["memory_retention"] = {
            "retained_growth_bytes": growth,
            "flat": all(flags) if None not in flags else None}
    result["total_wall_s"] = round(time.perf_counter() - t_total, 2)
    emit(result, args)
    if "parity" in result and not result["parity"]["ok"]:
        print(f"[benchmark] PARITY FAILED: {result['parity']['max_abs_diff']}",
              file=sys.stderr)
        return 1
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return run(parse_args(argv))


def command(argv: Optional[List[str]] = None) -> int:
    return main(argv)


if __name__ == "__main__":
    sys.exit(command())
