#!/usr/bin/env python
"""CPU benchmark of ErnieDocModel: throughput against PaddleNLP, parity, and streaming.

    python tools/benchmark.py --preset ernie-doc-base-en --batch-size 2 --seq-len 512 \
        --memory-len 128 [--steps 3] [--warmup 1] [--threads N] [--no-paddlenlp] \
        [--stream-lengths 2048 32768] [--output results.json]
    python tools/benchmark.py --quick --output tmp.json      # small and fast, for tests

(a) forward tokens/s (eval, no_grad) and forward+backward tokens/s (train mode) of ours and of
    PaddleNLP 2.8.1's ErnieDocModel built with the same config and the SAME weights, the
    ratios, and the parity of the two (max abs diff of sequence, pooled and memories over two
    segments, the second one carrying each model's own memories).
(b) streaming one document of each --stream-lengths tokens through our model segment by segment
    (eval, no_grad, carrying memories), each in a fresh subprocess so that its peak RSS is its
    own: wall time, time per segment and peak RSS, to show time linear and memory flat in
    document length.
(c) --threads N sets OMP_NUM_THREADS / MKL_NUM_THREADS before paddle is imported (paddle
    reads them at import; left unset, paddle itself sets OMP_NUM_THREADS=1) and calls
    paddle's set_num_threads where the version has it; the streaming subprocesses inherit it.

Inputs: random ids, attention_mask all ones and token_type_ids zeros, as in a plain document
stream; ours then skips the mask and the task term (its dygraph shortcuts), PaddleNLP computes
both. Prints one JSON object (also written atomically to --output).

Pretraining throughput (a mode of its own: with --pretrain-config none of (a)-(b) above runs,
and their options are ignored):

    python tools/benchmark.py --pretrain-config configs/pretrain/tiny.yaml \
        --pretrain-nproc 1 2 --pretrain-steps 60 [--pretrain-warmup 10] [--set k=v ...] \
        [--threads N] [--output results.json]

For each N of --pretrain-nproc the real tools/pretrain.py runs (N=1: plain python; N>1:
fleetrun --nproc_per_node N, data-parallel over gloo, its worker logs in a --log_dir of its
own) in a fresh temporary OUTPUT_DIR with `max_steps=<steps> progress=false logging_steps=0
save_steps=0`, then the --set items (passed through as tools/pretrain.py --set items; they may
not set max_steps or output_dir). CPU threads per process: --threads, else a `--set threads=K`,
else floor(cpu_count / N); OMP_NUM_THREADS / MKL_NUM_THREADS are set to it as well. From the
run's train_log.jsonl, after dropping the first --pretrain-warmup steps: median and mean
tokens/s per rank and the median aggregate tokens/s (rank 0's tokens x N / rank 0's step
time), with the wall seconds of the whole run (start-up and tokenizer training included), the
steps measured, and rows per rank / max_seq_len from the run's run_config.yaml; and, when N=1
was measured too, scaling_efficiency = aggregate(N) / (N x per-rank(1)). Tokens are the
non-padding tokens of every segment read: with retro_feed the skim pass counts too. The
temporary directories are removed; a failed run prints one `error:` line naming N and where
its logs were kept, then the tail of its worker log, and exits with 1.
"""
import argparse
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

# paddle's import warns about a C++ compiler cache it never uses here (stderr holds progress
# lines and, on bad input, the one error line)
warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)

# The folder holding the ernie_doc package (the repository, or site-packages): the
# subprocesses below import it from there.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

QUICK = dict(preset="ernie-doc-small", batch_size=2, seq_len=128, memory_len=32, steps=1,
             warmup=1, stream_lengths=[512, 2048])
PARITY_TOL = 1e-5
PRETRAIN_STEPS, PRETRAIN_WARMUP = 60, 10
TOKENS_COUNTED = "every segment read, skim pass included"


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="ernie-doc-base-en")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--memory-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=3, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: paddle's)")
    p.add_argument("--no-paddlenlp", action="store_true", help="skip the PaddleNLP baseline")
    p.add_argument("--stream-lengths", type=int, nargs="*", default=[2048, 32768],
                   help="document lengths (tokens) to stream; none to skip")
    p.add_argument("--stream-batch-size", type=int, default=1,
                   help="documents streamed side by side (rows)")
    p.add_argument("--output", default=None, help="also write the JSON here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="ernie-doc-small, B=2, T=128, M=32, 1 step, lengths 512 and 2048")
    p.add_argument("--stream-worker", type=int, default=None, help=argparse.SUPPRESS)
    g = p.add_argument_group("pretraining throughput (a mode of its own)")
    g.add_argument("--pretrain-config", default=None, metavar="CONFIG",
                   help="measure tools/pretrain.py with this config instead of the model")
    g.add_argument("--pretrain-nproc", type=int, nargs="+", default=None, metavar="N",
                   help="processes per run, one run each (default: 1)")
    g.add_argument("--pretrain-steps", type=int, default=None,
                   help=f"optimizer steps per run (default {PRETRAIN_STEPS})")
    g.add_argument("--pretrain-warmup", type=int, default=None,
                   help=f"first steps not measured (default {PRETRAIN_WARMUP})")
    g.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[],
                   metavar="KEY=VALUE", help="tools/pretrain.py --set items")
    return p


def given_on_command_line(argv, args):
    """The option names (dests) the command line set itself, defaults left out."""
    q = build_parser()
    for action in q._actions:   # no defaults: the namespace holds only what was given
        action.default = argparse.SUPPRESS
    return set(vars(q.parse_args(argv)))


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.pretrain_config is None:
        if args.overrides or args.pretrain_nproc or args.pretrain_steps is not None \
                or args.pretrain_warmup is not None:
            p.error("--set and --pretrain-* need --pretrain-config")
    else:
        check_pretrain_args(p, args)
    if args.quick:   # the small settings, under what the command line gave itself
        given = given_on_command_line(argv, args)
        for key, value in QUICK.items():
            if key not in given:
                setattr(args, key, value)
    for name in ("batch_size", "seq_len", "steps", "stream_batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.memory_len < 0 or args.warmup < 0 or (args.threads is not None and args.threads < 1):
        p.error("--memory-len and --warmup must be >= 0, --threads >= 1")
    if any(n < 1 for n in args.stream_lengths):
        p.error("--stream-lengths must be positive")
    if args.output is not None:
        from ernie_doc.utils import unwritable_file  # no paddle import: threads are not set
        problem = unwritable_file(args.output)
        if problem:
            p.error(f"--output {problem}")
    return args


def check_pretrain_args(p, args):
    args.pretrain_nproc = args.pretrain_nproc or [1]
    if args.pretrain_steps is None:
        args.pretrain_steps = PRETRAIN_STEPS
    if args.pretrain_warmup is None:
        args.pretrain_warmup = PRETRAIN_WARMUP
    if not os.path.isfile(args.pretrain_config):
        p.error(f"--pretrain-config {args.pretrain_config}: no such file")
    if any(n < 1 for n in args.pretrain_nproc):
        p.error("--pretrain-nproc must be >= 1")
    if args.pretrain_warmup < 0 or args.pretrain_steps <= args.pretrain_warmup:
        p.error("--pretrain-warmup must be >= 0 and --pretrain-steps greater than it")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    for item in args.overrides:
        key = item.split("=", 1)[0].split(".")[0].strip()
        if "=" not in item:
            p.error(f"--set {item!r}: expected key=value")
        if key in ("max_steps", "output_dir"):
            p.error(f"--set {key}: the benchmark sets it (use --pretrain-steps)")
    args.pretrain_nproc = list(dict.fromkeys(args.pretrain_nproc))  # each N once, in order


def set_threads(threads):
    """Before `import paddle`: paddle reads OMP_NUM_THREADS at import."""
    if threads is not None:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)


def apply_paddle_threads(threads):
    if threads is not None:
        from ernie_doc.utils import set_paddle_threads
        set_paddle_threads(threads)


def memory_kb():
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


def reset_peak_rss():
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def mb(kb):
    return None if kb is None else round(kb / 1024.0, 1)


def build_config(args):
    """The preset's config with --memory-len; a bad --preset / --seq-len is ConfigError."""
    from ernie_doc import ErnieDocConfig
    from ernie_doc.config import ConfigError
    try:
        config = ErnieDocConfig.from_preset(args.preset, memory_len=args.memory_len)
    except ConfigError as e:
        raise ConfigError(f"--preset {args.preset}: {e}") from None
    if args.seq_len > config.max_position_embeddings:
        raise ConfigError(f"--seq-len {args.seq_len} > max_position_embeddings "
                          f"{config.max_position_embeddings} of {args.preset}")
    return config


def build_ours(config, seed):
    import paddle

    from ernie_doc import ErnieDocModel
    paddle.seed(seed)
    return ErnieDocModel(config)


def build_paddlenlp(ours):
    """PaddleNLP's ErnieDocModel with our config and our weights (same state_dict names)."""
    from ernie_doc.reference import PaddleNLPReference
    return PaddleNLPReference(ours)


class Inputs:
    """One batch in both calling conventions. ours: ids/types/mask [B,T], memories [L,B,M,H];
    PaddleNLP: ids/types/mask [B,T,1], position ids [B,2T+M,1], a list of L [B,M,H]."""

    def __init__(self, config, batch, seq_len, rng):
        import numpy as np
        import paddle

        from ernie_doc.modeling.attention import relative_position_ids
        from ernie_doc.reference import official_position_ids
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

    def run_ours(self, model, memories):
        out = model(self.ids, memories, self.types, self.mask)
        return out.sequence_output, out.pooled_output, out.memories

    def run_paddlenlp(self, reference, memories):
        return reference(self.ids, memories, self.types, self.mask)


def parity(config, ours, pn, batch, seq_len, rng):
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


def time_steps(fn, steps, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def throughput(name, model, run, inputs, memories, args):
    """forward (eval, no_grad) and forward+backward (train) tokens/s of one model."""
    import paddle
    tokens = args.batch_size * args.seq_len

    def forward():
        with paddle.no_grad():
            out = run(model, memories)
        float(out[1].sum())  # make sure the work is done

    def forward_backward():
        seq, pooled, _ = run(model, memories)
        (seq.mean() + pooled.mean()).backward()
        model.clear_gradients()

    print(f"[benchmark] {name}: forward", file=sys.stderr, flush=True)
    model.eval()
    fwd = time_steps(forward, args.steps, args.warmup)
    print(f"[benchmark] {name}: forward+backward", file=sys.stderr, flush=True)
    model.train()
    fb = time_steps(forward_backward, args.steps, args.warmup)
    model.eval()
    return {"forward_tokens_per_s": round(tokens * len(fwd) / sum(fwd), 2),
            "forward_step_s": [round(t, 4) for t in fwd],
            "forward_backward_tokens_per_s": round(tokens * len(fb) / sum(fb), 2),
            "forward_backward_step_s": [round(t, 4) for t in fb]}


# ---------------------------------------------------------------------------------------------
# streaming (one subprocess per document length)
# ---------------------------------------------------------------------------------------------
def stream_worker(args):
    """Stream one document of args.stream_worker tokens; returns the result dict."""
    import numpy as np
    import paddle
    apply_paddle_threads(args.threads)
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

    times, rss_samples = [], []
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
            if i == 0:
                # From here on only the steady state counts: allocator pools and oneDNN caches
                # are warm after the first segment.
                rss_first, peak_first = memory_kb()
                peak_reset = reset_peak_rss()
            if n_seg < 8 or i in {n_seg // 4, n_seg // 2, (3 * n_seg) // 4, n_seg - 1}:
                rss_samples.append({"segment": i + 1, "rss_mb": mb(memory_kb()[0])})
    wall = time.perf_counter() - t_start
    rss_end, peak_after_first = memory_kb()
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
    }


def run_stream_subprocess(args, length):
    cmd = [sys.executable, "-m", "ernie_doc.cli.benchmark", "--stream-worker", str(length),
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
# pretraining throughput (tools/pretrain.py, one run per process count)
# ---------------------------------------------------------------------------------------------
class PretrainRunError(RuntimeError):
    """A pretraining run failed; the message names N and ends with its worker log's tail."""


def pretrain_threads(args, nproc):
    """CPU threads per process: --threads, else the user's `--set threads=K`, else
    floor(cpu_count / N). → (threads, whether the user chose them)."""
    if args.threads is not None:
        return args.threads, True
    for item in reversed(args.overrides):
        key, _, value = item.partition("=")
        if key.strip() == "threads":
            try:
                return int(value), True
            except ValueError:
                return None, True   # tools/pretrain.py says what is wrong with it
    return max(1, (os.cpu_count() or 1) // nproc), False


def pretrain_command(args, nproc, work):
    """→ (argv, env, worker log directory, threads per process) of one run in the scratch
    directory `work`."""
    from ernie_doc.cli import launch_script
    script = launch_script()
    log_dir = os.path.join(work, "log")
    if nproc == 1:
        cmd = [sys.executable, script]
    else:
        fleetrun = os.path.join(os.path.dirname(sys.executable), "fleetrun")
        launcher = [fleetrun] if os.path.exists(fleetrun) else [
            sys.executable, "-m", "paddle.distributed.launch"]
        cmd = [*launcher, "--nproc_per_node", str(nproc), "--log_dir", log_dir, script]
    cmd.append("pretrain")
    threads, chosen = pretrain_threads(args, nproc)
    sets = ["progress=false", "logging_steps=0", "save_steps=0"]
    if not chosen:
        sets.append(f"threads={threads}")
    sets += list(args.overrides)
    if args.threads is not None:   # --threads wins over a --set threads=K
        sets.append(f"threads={threads}")
    sets += [f"max_steps={args.pretrain_steps}", f"output_dir={os.path.join(work, 'out')}"]
    cmd += ["--config", args.pretrain_config, "--set", *sets]
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    if threads:   # paddle reads OMP_NUM_THREADS at import
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(threads)
    return cmd, env, log_dir, threads


def worker_log_tail(log_dir, launcher_log, lines=25):
    """(name, last lines) of the log that says what went wrong: the first worker log with an
    error or traceback, else workerlog.0, else the launcher's own output."""
    logs = []
    if os.path.isdir(log_dir):
        logs = sorted((n for n in os.listdir(log_dir) if n.startswith("workerlog.")),
                      key=lambda n: int(n.rsplit(".", 1)[1]) if n.rsplit(".", 1)[1].isdigit()
                      else 1 << 30)
    texts = {}
    for name in logs:
        with open(os.path.join(log_dir, name), encoding="utf-8", errors="replace") as f:
            texts[name] = f.read()
    bad = [n for n, t in texts.items() if "error:" in t or "Traceback" in t]
    name = (bad or logs or [None])[0]
    if name is None or not texts[name].strip():
        name = os.path.basename(launcher_log)
        with open(launcher_log, encoding="utf-8", errors="replace") as f:
            texts[name] = f.read()
    return name, "\n".join(texts[name].rstrip().splitlines()[-lines:])


def run_pretraining(args, nproc):
    """One tools/pretrain.py run with `nproc` processes → its throughput dict."""
    import yaml

    from ernie_doc.training.runlog import read_jsonl
    work = tempfile.mkdtemp(prefix=f"ernie-doc-bench-pretrain-n{nproc}-")
    cmd, env, log_dir, threads = pretrain_command(args, nproc, work)
    if nproc == 1:
        os.makedirs(log_dir)
    # plain python: its output is its worker log; fleetrun: the launcher's own output
    launcher_log = os.path.join(log_dir if nproc == 1 else work,
                                "workerlog.0" if nproc == 1 else "launcher.log")
    print(f"[benchmark] pretraining with {nproc} process(es), {threads} thread(s) each",
          file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with open(launcher_log, "w", encoding="utf-8") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    wall = time.perf_counter() - t0
    out = os.path.join(work, "out")
    records = read_jsonl(os.path.join(out, "train_log.jsonl")) if code == 0 else []
    measured = [r for r in records if r["step"] > args.pretrain_warmup]
    if code != 0 or not measured:
        why = (f"exit {code}" if code != 0 else
               f"{len(records)} steps logged, none after the {args.pretrain_warmup} warm-up "
               "steps")
        name, tail = worker_log_tail(log_dir, launcher_log)
        raise PretrainRunError(f"pretraining with N={nproc} process(es) failed ({why}; logs "
                               f"kept in {work}); the tail of {name}:\n{tail}")
    with open(os.path.join(out, "run_config.yaml"), encoding="utf-8") as f:
        run_config = yaml.safe_load(f)
    shutil.rmtree(work, ignore_errors=True)
    per_rank = [float(r["tokens_per_sec_per_rank"]) for r in measured]
    aggregate = [float(r["tokens_per_sec"]) for r in measured]
    return {
        "nproc": nproc,
        "threads_per_process": threads,
        "rows_per_rank": run_config["batch_size"],
        "grad_accum_steps": run_config["grad_accum_steps"],
        "max_seq_len": run_config["max_seq_len"],
        "retro_feed": run_config["retro_feed"],
        "steps_logged": len(records),
        "steps_measured": len(measured),
        "tokens_per_sec_per_rank_median": round(statistics.median(per_rank), 1),
        "tokens_per_sec_per_rank_mean": round(statistics.fmean(per_rank), 1),
        "tokens_per_sec_median": round(statistics.median(aggregate), 1),
        "wall_s": round(wall, 2),
    }


def pretraining_main(args):
    t_total = time.perf_counter()
    result = {
        "setup": {"mode": "pretraining", "config": args.pretrain_config,
                  "nproc": args.pretrain_nproc, "steps": args.pretrain_steps,
                  "warmup_steps_dropped": args.pretrain_warmup, "overrides": args.overrides,
                  "launcher": "python (N=1), fleetrun --nproc_per_node N (N>1; gloo on CPU)",
                  "tokens": "non-padding tokens (attention_mask) of the rows fed",
                  "aggregate": "rank 0's tokens x N / rank 0's step time",
                  "scaling_efficiency": "aggregate(N) / (N x per-rank(1)), medians"},
        "environment": environment(args, paddlenlp=False),
    }
    runs = []
    for nproc in args.pretrain_nproc:
        try:
            runs.append(run_pretraining(args, nproc))
        except PretrainRunError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    base = next((r for r in runs if r["nproc"] == 1), None)
    for r in runs:
        if base is not None:
            r["scaling_efficiency"] = round(
                r["tokens_per_sec_median"] / (r["nproc"] * base["tokens_per_sec_per_rank_median"]),
                3)
    retro = any(r["retro_feed"] for r in runs)
    result["setup"]["tokens_counted"] = TOKENS_COUNTED if retro else "every segment read"
    result["pretraining"] = runs
    result["total_wall_s"] = round(time.perf_counter() - t_total, 2)
    emit(result, args)
    return 0


# ---------------------------------------------------------------------------------------------
def emit(result, args):
    """The load average at the end, then the JSON on stdout and (atomically) in --output."""
    try:  # other work on the machine skews timings: say how busy it was
        result["environment"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        from ernie_doc.utils import atomic_write_text, write_error_types, write_failure
        try:
            atomic_write_text(args.output, text + "\n")
        except write_error_types() as e:   # full disk, read-only (checked free at the start)
            message = write_failure(e, args.output, "--output", target_is_dir=False)
            if message is None:
                raise
            print(f"error: {message} (the results are on stdout above)", file=sys.stderr)
            sys.exit(2)


def environment(args, paddlenlp=True):
    """paddlenlp: also its version (its import takes seconds)."""
    import paddle
    env = {
        "python": platform.python_version(),
        "paddle": paddle.__version__,
        "cpu_count": os.cpu_count(),
        "threads_arg": args.threads,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "machine": platform.machine(),
    }
    if paddlenlp:
        try:
            import paddlenlp
            env["paddlenlp"] = paddlenlp.__version__
        except Exception:  # noqa: BLE001 - the baseline is optional
            env["paddlenlp"] = None
    try:
        env["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    return env


def main(argv=None):
    args = parse_args(argv)
    set_threads(args.threads)
    if args.stream_worker is not None:
        print(json.dumps(stream_worker(args)), flush=True)
        return 0
    if args.pretrain_config is not None:
        return pretraining_main(args)

    import numpy as np
    import paddle
    apply_paddle_threads(args.threads)
    t_total = time.perf_counter()
    from ernie_doc.config import ConfigError
    try:
        config = build_config(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = {
        "setup": {"preset": args.preset, "batch_size": args.batch_size, "seq_len": args.seq_len,
                  "memory_len": args.memory_len, "steps": args.steps, "warmup": args.warmup,
                  "quick": args.quick, "hidden_size": config.hidden_size,
                  "layers": config.num_hidden_layers, "vocab_size": config.vocab_size,
                  "inputs": "random ids, attention_mask all ones, token_type_ids zeros, "
                            "memories carried from a previous segment"},
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
    tp = {"ours": throughput("ours", ours, inputs.run_ours, inputs, memories, args)}
    if pn is not None:
        tp["paddlenlp"] = throughput("paddlenlp", pn, inputs.run_paddlenlp, inputs, memories,
                                     args)
        tp["ratio_ours_over_paddlenlp"] = {
            key: round(tp["ours"][key] / tp["paddlenlp"][key], 3)
            for key in ("forward_tokens_per_s", "forward_backward_tokens_per_s")}
    result["throughput"] = tp
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
    result["total_wall_s"] = round(time.perf_counter() - t_total, 2)
    emit(result, args)
    if "parity" in result and not result["parity"]["ok"]:
        print(f"[benchmark] PARITY FAILED: {result['parity']['max_abs_diff']}",
              file=sys.stderr)
        return 1
    return 0


def command(argv=None) -> int:
    return main(argv)


if __name__ == "__main__":
    sys.exit(command())
