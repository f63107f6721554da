"""The one training loop, shared by every task kind: fine-tuning, pretraining and the
language model. It receives a prepared run (`training.prepare`: task, model, splits, all
checked) and never asks what kind of task it runs.

    split.batches ─▶ batch ─task.forward(model, batch, memory state)─▶ outputs, new state
      ─task.train_loss─▶ backward ─(every grad_accum_steps)─▶ optimizer step ─▶ log
      ─(eval_steps / epoch end / last step)─▶ evaluate ─▶ metrics, best checkpoint

SIGINT and SIGTERM stop a run after the step under way, with its checkpoint written, and raise
`Interrupted` (exit 128 + the signal). Details: docs/design-notes.md, "Training: the loop"."""
import contextlib
import json
import math
import os
import shlex
import signal
import threading
import time
import zlib
from collections import defaultdict
from typing import Any, DefaultDict, Dict, Iterator, List, Optional, Tuple

import numpy as np
import paddle

from ernie_doc import distributed as dist
from ernie_doc import peers
from ernie_doc.assemble import tokenizer_record
from ernie_doc.data.splits import Split
from ernie_doc.errors import (Bf16ProgramError, CheckpointStateError, ConfigError, ErnieDocError,
                              TrainingError)
from ernie_doc.run_config import batch_rows
from ernie_doc.training import outdir
from ernie_doc.training import state as ckpt
from ernie_doc.training.compiled import CompiledForward, compiled_or_none, try_compiled
from ernie_doc.training.optim import build_optimizer, describe_optimizer, run_warmup
from ernie_doc.training.prepare import RUN_CONFIG, PreparedRun, prepare, task_record, training_plan
from ernie_doc.training.runlog import RunLog, logger, plot_curves, read_jsonl
from ernie_doc.utils import progress_bar

__all__ = ["RUN_CONFIG", "Interrupted", "StopSignals", "Trainer", "run",
           "step_seed"]


class Interrupted(KeyboardInterrupt):
    """The run stopped on SIGINT / SIGTERM. `step`: optimizer steps done (None: none); the
    `message` reads what can be resumed from OUTPUT_DIR. A KeyboardInterrupt, for cleanup."""

    def __init__(self, signum: int, output_dir: Optional[str] = None,
                 step: Optional[int] = None):
        super().__init__(signum)
        self.signum, self.output_dir, self.step = signum, output_dir, step
        self.finished = False   # stopped after the last step, in the final evaluation

    @property
    def status(self) -> int:
        """The exit status a shell gives a process ended by the signal: 130, 143."""
        return 128 + int(self.signum)

    def message(self, command: str) -> Optional[str]:
        """The one line for the user (the step, and the command that continues the run), or
        None on a rank other than 0."""
        if dist.rank() != 0:
            return None
        where = "interrupted before the first step" if self.step is None else \
            f"interrupted at step {self.step}"
        if self.output_dir is None:
            return f"{where}: nothing was written; run the same command again"
        # absolute: the line works from any directory, and never reads as an option ("-run")
        out = os.path.abspath(self.output_dir)
        resume = f"{command} --resume {shlex.quote(out)}"
        world, local = dist.world_size(), dist.local_size()
        if 0 < local < world:   # several nodes: each launches its part (--nproc is one node's)
            resume = f"--resume {shlex.quote(out)} on every node"
        elif world > 1:
            resume += f" --nproc {world}"
        saved, best = _latest_step(out), _best_model(out)
        if self.finished and saved == self.step:
            return (f"{where}, the last, during the final evaluation: the trained model is "
                    f"in {os.path.join(out, 'checkpoints', f'step-{saved}')}")
        if saved is not None and saved == self.step:
            return f"{where}: resume with {resume}"
        if saved is not None:
            return f"{where}, not saved: resume from step {saved} with {resume}"
        if best is not None:   # never advise overwrite_output_dir: it would delete the model
            when = ", the last, during the final evaluation" if self.finished else ", not saved"
            config = shlex.quote(os.path.join(out, RUN_CONFIG))
            return (f"{where}{when}: the best model is in {best}; evaluate it with {command} "
                    f"{config} --set eval_only=true init_checkpoint={shlex.quote(best)} "
                    f"output_dir=NEW_DIR")
        if os.path.isfile(os.path.join(out, RUN_CONFIG)):
            return (f"{where}, before any checkpoint: nothing to resume; start over with the "
                    "same command and --set overwrite_output_dir=true")
        return f"{where}: nothing was written; run the same command again"


def _best_model(output_dir: str) -> Optional[str]:
    """The best model a run saved (OUTPUT_DIR/best, else its newest checkpoints/best-step-N
    directory) → its path, or None."""
    best = os.path.join(output_dir, "best")
    if os.path.isdir(best):
        return best
    folder = os.path.join(output_dir, ckpt.CHECKPOINTS)
    try:
        steps = [n for n in (ckpt.step_number(name, "best-step-") for name in os.listdir(folder))
                 if n is not None]
    except OSError:
        return None
    return os.path.join(folder, f"best-step-{max(steps)}") if steps else None


def _latest_step(output_dir: str) -> Optional[int]:
    """N of the checkpoint OUTPUT_DIR/checkpoints/latest points to, or None (none, or not
    a complete one)."""
    try:
        path = ckpt.latest_checkpoint(output_dir)
    except CheckpointStateError:
        return None
    return ckpt.step_number(os.path.basename(path)) if path else None


class StopSignals:
    """SIGINT / SIGTERM during a run: before training raise Interrupted at once; in training stop
    after saving the step (a repeat raises); inside `writing()` wait for the write."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum = None    # the first signal received while deferring
        self.defer = False
        self._writing, self._pending = 0, None

    @contextlib.contextmanager
    def installed(self) -> Iterator["StopSignals"]:
        """The handlers for the block (main thread only: signals reach no other), the
        previous ones restored after."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        saved = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        try:
            yield self
        finally:
            for s, handler in saved.items():
                signal.signal(s, handler)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """A block no signal interrupts (a checkpoint write); one that came meanwhile is
        handled when it ends."""
        self._writing += 1
        try:
            yield
        finally:
            self._writing -= 1
        if not self._writing and self._pending is not None:
            signum, self._pending = self._pending, None
            self._handle(signum, None)

    def _handle(self, signum, frame):
        if self._writing:
            self._pending = self._pending or signum
            return
        # the other signal is the same request delivered twice (terminal and launcher): only
        # the same signal again means "do not wait"
        if self.defer and signum != self.signum:
            self.signum = self.signum or signum
            return
        raise Interrupted(self.signum or signum)


def step_seed(seed: int, rank: int, step: int) -> int:
    """Dropout seed of one micro-step: a function of (seed, rank, step) alone, so a resumed
    run draws exactly the masks the uninterrupted one would have."""
    return zlib.crc32(f"{seed}:{rank}:{step}".encode()) & 0x7FFFFFFF


def _format(metrics):
    return " ".join(f"{k} {v:.4f}" for k, v in metrics.items())


def _timed(items, timing):
    """`items`, adding the seconds each next() takes to timing["input_s"]."""
    items = iter(items)
    while True:
        start = time.perf_counter()
        try:
            item = next(items)
        except StopIteration:
            return
        finally:
            timing["input_s"] += time.perf_counter() - start
        yield item


def _to_tensors(batch):
    return {k: paddle.to_tensor(v) for k, v in batch.items()}


class Trainer:
    """Runs a PreparedRun: `train()` or `evaluate_only()`. `model` is the network (saved,
    evaluated), `wrapped` the same inside DataParallel when there are several ranks."""

    def __init__(self, run: PreparedRun):
        self.run = run
        self.cfg, self.task = run.cfg, run.task
        assert run.model is not None and run.wrapped is not None   # prepare() built both
        self.model, self.wrapped = run.model, run.wrapped
        self.tokenizer = run.tokenizer
        self.rank, self.world, self.is_main = run.rank, run.world, run.is_main
        self.out = run.out
        self.state: Dict[str, Any] = {}   # the trainer state a checkpoint saves (train())
        self.last_memories = None  # numpy [L, B, M, H] after training (tests compare ranks)
        self.compiled: Optional[CompiledForward] = None   # the training forward (compile: true)
        self.signals = StopSignals()   # run() installs its handlers
        self._stop_signal = None   # a stop signal every rank has seen (`_over_ranks`)

    # -- training ------------------------------------------------------------------------------
    def train(self) -> Optional[dict]:
        """Train to the end (or to stop_at_step) → eval_results.json's content (results.json's
        for a streamed run without held-out data); None when stopped at stop_at_step. With
        several ranks each watches the others (`ernie_doc.peers`, `peer_timeout`): a lost one
        ends this process with one line naming it."""
        dist.barrier()   # every rank's watch starts at once
        watch = peers.watch(self.cfg.peer_timeout, self._resume_hint) if self.world > 1 else None
        try:
            return self._train()
        except Exception as e:
            if watch is not None and not isinstance(e, (ErnieDocError, OSError)):
                watch.settle()   # a failed collective call: a lost peer ends the process here
            raise
        finally:
            if watch is not None:
                watch.stop()

    def _resume_hint(self) -> str:
        """What a lost peer's line adds: the checkpoint a resume starts from, and how."""
        out = os.path.abspath(self.out)
        step = _latest_step(out)
        if step is None:
            return (f"no checkpoint in {out} yet: start over with the same commands and --set "
                    "overwrite_output_dir=true")
        return (f"the last complete checkpoint is {os.path.join(out, ckpt.CHECKPOINTS)}"
                f"/step-{step}; resume with --resume {shlex.quote(out)} on every node")

    def _train(self) -> Optional[dict]:
        cfg, run = self.cfg, self.run
        train, total_steps, accum = run.train, run.total_steps, cfg.grad_accum_steps
        assert train is not None and total_steps is not None   # a training run's
        optimizer, scheduler, scaler = self._set_up_optimizer(total_steps)
        state, carry = self._start(optimizer, scheduler)   # trainer state, rows' memories
        log = self._run_log(state["step"])
        bar = self._progress_bar(train, total_steps)
        self.wrapped.train()
        # per micro-step since the last optimizer step: (mean loss, rows), task metric sums
        metrics: DefaultDict[str, List[float]] = defaultdict(lambda: [0.0, 0.0])
        losses, tokens, t0 = [], 0, time.perf_counter()
        self._since_log = (0.0, 0.0)   # loss sum and rows since the last log line
        # wall time of the optimizer steps, and the part of it spent waiting for the next batch
        # (reading, tokenizing, segmenting, collating): timing.json
        timing = {"steps": 0, "train_s": 0.0, "input_s": 0.0}
        stop = interrupt = False
        self.signals.defer = True   # a signal now stops the run at a step's end
        for epoch, micro, batch, boundary, epoch_end in _timed(
                self._micro_batches(train, state), timing):
            seed = step_seed(cfg.seed, self.rank, state["step"] * accum + micro % accum)
            paddle.seed(seed)
            value, rows, carry, step_metrics = self._micro_step(batch, carry, scaler, boundary,
                                                                seed)
            for name, (total, count) in step_metrics.items():
                metrics[name][0] += total
                metrics[name][1] += count
            if not math.isfinite(value):
                raise TrainingError(
                    f"step {state['step'] + 1} (epoch {epoch + 1}): the loss is {value}; "
                    f"stopping. Try a lower learning_rate or max_grad_norm: 1.0")
            losses.append((value, rows))
            tokens += self.task.batch_tokens(batch)
            if not boundary:
                continue
            lr = self._optimizer_step(optimizer, scheduler, scaler)
            state["epoch"], state["micro"] = epoch, micro + 1
            elapsed = time.perf_counter() - t0
            timing["steps"] += 1
            timing["train_s"] += elapsed
            self._report(log, bar, epoch, lr, tokens, elapsed, losses, metrics)
            losses, metrics, tokens = [], defaultdict(lambda: [0.0, 0.0]), 0
            last = state["step"] == total_steps
            if epoch_end:
                state["epoch"], state["micro"] = epoch + 1, 0
            stop, interrupt = self._evaluate_and_save(log, carry, epoch_end, last)
            if stop or last or interrupt:
                break
            # after evaluation and checkpoints: the next step's time (tokens/s, timing.json)
            # is its own
            t0 = time.perf_counter()
        bar.close()
        return self._end_of_run(log, timing, carry, stop, interrupt)

    def _set_up_optimizer(self, total_steps: int) -> Tuple[Any, Any, Any]:
        """→ (optimizer, LR scheduler, fp16 loss scaler or None) for the run's total steps;
        the compiled training forward is built here too (compile: true)."""
        cfg, run = self.cfg, self.run
        # layer-wise LR decay needs the encoder's depth (kinds without layers refuse decay)
        layers = self.model.config.num_hidden_layers if cfg.layer_decay != 1.0 else 0
        optimizer, scheduler = build_optimizer(self.wrapped, cfg, total_steps, layers)
        self.optimizer = optimizer
        self.compiled = compiled_or_none(self.model, cfg.compile, self.world, run.amp)
        return optimizer, scheduler, run.amp.scaler()   # the scaler: fp16 only

    def _progress_bar(self, train: Split, total_steps: int) -> Any:
        """The progress bar of the optimizer steps (main rank, when progress is shown), after
        logging the run's plan (epochs, steps, rows per step) and its optimiser."""
        cfg = self.cfg
        bar = progress_bar(total=total_steps, initial=self.state["step"], desc=f"train {cfg.task}",
                           requested=self.is_main and cfg.progress, dynamic_ncols=True,
                           mininterval=1.0)
        rows = batch_rows(cfg, self.task.group_size)
        logger.info(f"training: {training_plan(cfg, train, total_steps)} "
                    f"({rows} rows/rank x {self.world} ranks x "
                    f"{cfg.grad_accum_steps} accumulation)")
        logger.info(describe_optimizer(cfg, total_steps))
        return bar

    def _optimizer_step(self, optimizer: Any, scheduler: Any, scaler: Any) -> float:
        """Apply the accumulated gradients (through the fp16 scaler when there is one), clear
        them, advance the LR schedule and the step count → the learning rate just used."""
        lr = optimizer.get_lr()
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.clear_grad()
        scheduler.step()
        self.state["step"] += 1
        return lr

    def _evaluate_and_save(self, log: RunLog, carry: dict, epoch_end: bool,
                           last: bool) -> Tuple[bool, bool]:
        """After an optimizer step: evaluate and save when due → (stop at stop_at_step, stop
        on a signal)."""
        cfg, state = self.cfg, self.state
        evaluate = last or (cfg.eval_steps and state["step"] % cfg.eval_steps == 0) \
            or (epoch_end and cfg.eval_every_epoch)
        if evaluate:
            self._evaluate_and_keep_best(log)
        stop = bool(cfg.stop_at_step) and state["step"] == cfg.stop_at_step and not last
        # SIGINT / SIGTERM: every rank stops after the same step (the last one finishes)
        interrupt = self._stop_requested() is not None and not last
        if evaluate or stop or interrupt or \
                (cfg.save_steps and state["step"] % cfg.save_steps == 0):
            self._save_state(carry)
        if stop:
            logger.info(f"stop_at_step {cfg.stop_at_step}: stopping; continue with "
                        f"--resume {self.out}")
        return stop, interrupt

    def _end_of_run(self, log: RunLog, timing: dict, carry: dict, stop: bool,
                    interrupt: bool) -> Optional[dict]:
        """timing.json, the final memories, then: Interrupted on a signal, None at
        stop_at_step, else the final evaluation's results (`_finish`); the logs closed."""
        self._write_timing(timing)
        self.last_memories = None if carry.get("memories") is None else \
            carry["memories"].numpy()
        if interrupt:
            log.close()
            logger.info(f"interrupted (signal {self._stop_requested()}): stopped at step "
                        f"{self.state['step']}, saved")
            raise Interrupted(self._stop_requested(), self.out, self.state["step"])
        results = None
        if not stop:
            results = self._finish(log)
        log.close()
        return results

    def _stop_requested(self):
        """The signal that stops the run at this step's end, or None (with several ranks, the
        one gathered with the step's records, so all stop alike)."""
        return self._stop_signal if self.world > 1 else self.signals.signum

    def _write_timing(self, timing):
        """timing.json: this process's optimizer steps, their wall time (evaluation and
        checkpoints excluded) and the share spent waiting for batches; logged too."""
        if not (self.is_main and timing["steps"]):
            return
        share = timing["input_s"] / max(timing["train_s"], 1e-9)
        record = {"steps": timing["steps"], "train_s": round(timing["train_s"], 6),
                  "input_s": round(timing["input_s"], 6), "input_share": round(share, 4)}
        outdir.write_text(self.out, "timing.json",
                          json.dumps(record, indent=1, sort_keys=True) + "\n")
        logger.info(f"input pipeline: {share:.1%} of {timing['train_s']:.1f} s of training "
                    f"steps spent waiting for batches (reading, tokenizing, collating)")

    def _run_log(self, resume_step=0):
        """The run's logs (runlog.RunLog), their names listed in the run's manifest first."""
        if self.is_main:
            outdir.claim(self.out, "train_log.jsonl", "eval_history.jsonl", "vdl")
        return RunLog(self.out, self.is_main, resume_step=resume_step)

    def _start(self, optimizer, scheduler):
        """→ (trainer state, memory state) at the start: fresh, or restored from the checkpoint
        prepare read for --resume (the optimizer's state too)."""
        run = self.run
        # micro: micro-steps read in the current epoch; best: main metric of the best eval
        state = {"epoch": 0, "micro": 0, "step": 0, "best": None, "best_step": None,
                 "total_steps": run.total_steps}
        carry = self.task.init_carry(self.model, batch_rows(self.cfg, self.task.group_size))
        if run.resume:
            path, state, arrays, optimizer_state = run.resumed   # checked in prepare
            ckpt.load_optimizer_state(self.model, optimizer, optimizer_state)
            carry.update({k: paddle.to_tensor(v) for k, v in arrays.items() if k != "stream"})
            if run.train.endless:   # the stream's position beyond the micro-step index
                run.train.load_state_array(arrays["stream"])
            logger.info(f"resumed from {path}: step {state['step']}, epoch {state['epoch']}")
            if run.extends is not None:
                self._extend_schedule(state, scheduler)
        self.state = state
        return state, carry

    def _extend_schedule(self, state, scheduler):
        """A finished run resumed with more steps: the LR schedule becomes that of the new total,
        at the step reached (one log line says the steps taken followed the old one)."""
        cfg, old, new, step = self.cfg, self.run.extends, self.run.total_steps, state["step"]
        before = scheduler.last_lr
        scheduler.step(step)   # last_lr = base lr x the new schedule's factor at `step`
        state["total_steps"] = new   # what later checkpoints record
        warmup = run_warmup(cfg, new)
        logger.info(f"max_steps / epochs raised: continuing the run that finished at step "
                    f"{step} to step {new}; the learning rate follows the {cfg.lr_schedule} "
                    f"schedule of a {new}-step run (warmup {warmup}) from step {step} on, "
                    f"now {scheduler.last_lr:.3e} (the {old}-step schedule the first {step} "
                    f"steps followed had reached {before:.3e})")
        if scheduler.last_lr <= 0 < cfg.learning_rate:   # never train at lr 0 silently
            logger.warning(f"WARNING the learning rate at step {step} of {new} is 0: the "
                           "resumed steps will not change the model")

    def _report(self, log, bar, epoch, lr, tokens, elapsed, losses, metrics):
        """One optimizer step's record (loss and task scalars over ranks, throughput) into
        train_log.jsonl / VisualDL, the progress bar and, every logging_steps, the log."""
        cfg, state = self.cfg, self.state
        elapsed = max(elapsed, 1e-9)
        record = {"step": state["step"], "epoch": epoch + 1, "lr": lr,
                  "tokens_per_sec": round(tokens * self.world / elapsed, 1),
                  "tokens_per_sec_per_rank": round(tokens / elapsed, 1)}
        step_sum, step_rows, task_metrics = self._over_ranks(losses, metrics)
        if step_rows:   # no loss when every row only skimmed (retro feed)
            record["loss"] = step_sum / step_rows
        record.update(task_metrics)
        total, count = self._since_log
        self._since_log = (total + record.get("loss", 0.0) * bool(step_rows),
                           count + bool(step_rows))
        log.train_step(record)
        bar.update(1)
        total, count = self._since_log
        shown = f"{total / count:.4f}" if count else "-"
        bar.set_postfix(loss=shown, lr=f"{lr:.2e}")
        if cfg.logging_steps and state["step"] % cfg.logging_steps == 0:
            extra = "".join(f" {k} {v:.4f}" for k, v in task_metrics.items() if k != "loss")
            logger.info(f"step {state['step']}/{state['total_steps']} epoch {epoch + 1} "
                        f"loss {shown}{extra} lr {lr:.3e} {record['tokens_per_sec']:.0f} tok/s")
            self._since_log = (0.0, 0.0)

    def _micro_batches(self, train, state):
        """→ (epoch, micro-step, batch, ends an optimizer step, ends the epoch) from the resume
        position on; a stream reports its corpus pass as the epoch."""
        cfg, accum = self.cfg, self.cfg.grad_accum_steps
        first = 0 if train.endless else state["epoch"]
        for epoch in range(first, 1 if train.endless else cfg.epochs):
            steps = train.num_steps(epoch)   # None for a stream
            start = state["micro"] if epoch == first else 0
            for micro, (label, batch) in enumerate(train.batches(epoch, start), start):
                end = steps is not None and micro + 1 == steps
                yield label, micro, batch, (micro + 1) % accum == 0 or end, end

    def _micro_step(self, batch, carry, scaler, sync, seed):
        """One micro-step through the compiled forward when `compile` is on (falling back
        to dygraph, with a log line, if its first step cannot be captured), else dygraph."""
        if self.compiled is None:
            return self._forward_backward(batch, carry, scaler, sync, self.wrapped)

        def undo():   # the failed attempt's gradients and random draws
            self.optimizer.clear_grad()
            paddle.seed(seed)

        try:
            result, used = try_compiled(
                lambda model: self._forward_backward(batch, carry, scaler, sync, model),
                self.compiled, self.wrapped, undo)
        except Bf16ProgramError as e:
            raise TrainingError(str(e)) from e
        if used is self.wrapped:
            self.compiled = None
        return result

    def _forward_backward(self, batch, carry, scaler, sync, model):
        """One micro-step → (loss value, rows that trained, new memory state, metric sums);
        gradients are all-reduced only when `sync` (an optimizer step's last micro-step)."""
        cfg = self.cfg
        t = _to_tensors(batch)
        weight = paddle.to_tensor(self.task.train_weight(batch).astype("float32"))
        with self.run.amp.autocast():
            out, carry = self.task.forward(model, t, carry)
            loss, step_metrics = self.task.train_loss(out, t, weight)
        value = float(loss)
        if math.isfinite(value):
            scaled = loss / cfg.grad_accum_steps
            if scaler is not None:
                scaled = scaler.scale(scaled)
            if self.world > 1 and not sync:
                with self.wrapped.no_sync():
                    scaled.backward()
            else:
                scaled.backward()
        return value, float(weight.sum()), carry, step_metrics

    def _save_state(self, carry):
        arrays = {k: v.numpy() for k, v in carry.items() if v is not None}
        stream = self.run.train.state_array()
        if stream is not None:
            arrays["stream"] = stream
        with self.signals.writing():
            ckpt.save_training_state(self.out, self.state["step"], self.model,
                                     self.optimizer, self.state, arrays,
                                     self.cfg.keep_checkpoints)

    def _over_ranks(self, losses, metrics):
        """(loss summed over training rows, number of such rows, {task metric: mean}) over
        these micro-steps and all ranks."""
        total = (sum(v * n for v, n in losses), sum(n for _, n in losses), dict(metrics),
                 self.signals.signum)   # and whether this rank was asked to stop
        parts = dist.gather_objects(total) if self.world > 1 else [total]
        self._stop_signal = next((p[3] for p in parts if p[3] is not None), None)
        merged = defaultdict(lambda: [0.0, 0.0])
        for part in parts:
            for name, (value, count) in part[2].items():
                merged[name][0] += value
                merged[name][1] += count
        means = {name: value / count for name, (value, count) in merged.items() if count}
        return sum(p[0] for p in parts), sum(p[1] for p in parts), self.task.combine_metrics(means)

    # -- evaluation ----------------------------------------------------------------------------
    def evaluate(self, split_name: str):
        """Read an evaluated split once from an empty memory state (eval mode) → (metrics,
        predictions or None) on every rank."""
        split = self.run.evaluated[split_name]
        evaluation = split.evaluation(self.task)
        self.wrapped.eval()
        carry: Dict[str, Any] = {}
        with paddle.no_grad(), split.protocol(self.model):
            for _, batch in progress_bar(split.batches(0, 0), total=split.num_steps(0),
                                         desc=f"eval {split_name}", leave=False,
                                         requested=self.is_main and self.cfg.progress,
                                         dynamic_ncols=True, mininterval=1.0):
                t = _to_tensors(batch)
                with self.run.amp.autocast():
                    out, carry = self.task.forward(self.wrapped, t, carry)
                evaluation.add(batch, t, out)
        self.wrapped.train()
        return evaluation.finish(dist.gather_objects(evaluation.part()))

    def _main_metric(self):
        return self.cfg.main_metric or self.task.main_metric

    def _evaluate_and_keep_best(self, log):
        step = self.state["step"]
        main = self._main_metric()
        for i, split in enumerate(self.cfg.eval_splits):
            metrics, predictions = self.evaluate(split)
            if main not in metrics:
                raise ConfigError(f"main_metric {main!r}: the task reports {sorted(metrics)}")
            log.evaluation(split, step, metrics)
            logger.info(f"eval {split} @ step {step}: {_format(metrics)}")
            if i == 0 and (self.state["best"] is None
                           or self.task.better(main, metrics[main], self.state["best"])):
                self.state["best"], self.state["best_step"] = metrics[main], step
                if self.is_main:
                    with self.signals.writing():
                        self._write_results("eval_results.json", split, step, metrics,
                                            predictions)
                        ckpt.save_best(self.out, step, self.model, self._tokenizer_files(),
                                       dict(metrics, step=step, split=split),
                                       task=task_record(self.run),
                                       tokenizer_config=self._tokenizer_config())
                dist.barrier()
        if self.is_main:
            plot_curves(self.out, main)

    def _tokenizer_config(self):
        """tokenizer_config.json of every saved model (the tokenizer's recorded type, and the
        segment it lays a text out as), or None without a tokenizer."""
        saved_config = getattr(self.tokenizer, "saved_config", None)
        if not saved_config:
            return None
        return tokenizer_record(self.cfg, self.task, saved_config())

    def _tokenizer_files(self):
        """Files saved beside every exported model (tokenizer or vocabulary)."""
        if self.tokenizer:
            return getattr(self.tokenizer, "source_files", [])
        return self.task.model_files(outdir.atomic_entry)

    def _record(self, split, step, metrics):
        """What eval_results.json / {split}_results.json hold."""
        return dict(metrics, step=step, split=split, main_metric=self._main_metric())

    def _write_results(self, name, split, step, metrics, predictions):
        results = self._record(split, step, metrics)
        outdir.write_text(self.out, name, json.dumps(results, indent=1, sort_keys=True) + "\n")
        if predictions is None:   # a stream split: no per-document predictions
            return
        outdir.write_text(self.out, f"predictions_{split}.jsonl",
                          "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions))

    def _finish_streamed(self):
        """A streamed split's end: OUTPUT_DIR/final and results.json (training scalars over
        the last tenth of the steps, and the last evaluation)."""
        records = read_jsonl(os.path.join(self.out, "train_log.jsonl")) if self.is_main else []
        tail = records[-max(1, len(records) // 10):]
        keys = sorted({k for r in tail for k in r if k not in ("step", "epoch")})
        train = {k: float(np.mean([r[k] for r in tail if k in r])) for k in keys}
        evals = read_jsonl(os.path.join(self.out, "eval_history.jsonl")) if self.is_main else []
        results = {"step": self.state["step"], "train_last_steps": len(tail), "train": train,
                   "eval": evals[-1] if evals else None,
                   "final_model": os.path.join(self.out, "final")}
        if self.is_main:
            ckpt.save_final(self.out, self.model, self._tokenizer_files(),
                            task=task_record(self.run), tokenizer_config=self._tokenizer_config())
            outdir.write_text(self.out, "results.json",
                              json.dumps(results, indent=1, sort_keys=True) + "\n")
            plot_curves(self.out, self._main_metric())
        dist.barrier()
        logger.info(f"training done at step {self.state['step']}: "
                    + " ".join(f"{k} {v:.4f}" for k, v in train.items() if "tokens" not in k)
                    + f"; model in {results['final_model']}")
        return results

    def _finish(self, log):
        """The final model of a streamed run, then the test splits with the best (else final)
        model → eval_results.json's content (results.json's when there is none)."""
        results = self._finish_streamed() if self.run.train.endless else None
        best_step = self.state["best_step"]
        if self.cfg.test_splits:
            if best_step is not None:
                best = os.path.join(self.out, "best")
                self.model.set_state_dict(type(self.model).from_pretrained(best).state_dict())
            step = self.state["step"] if best_step is None else best_step
            which = "final model" if best_step is None else f"best step {best_step}"
            for i, split in enumerate(self.cfg.test_splits):
                metrics, predictions = self.evaluate(split)
                log.evaluation(split, step, metrics)
                logger.info(f"test {split} ({which}): {_format(metrics)}")
                if self.is_main:
                    self._write_results(f"{split}_results.json", split, step, metrics,
                                        predictions)
                    if best_step is None and i == 0:
                        self._write_results("eval_results.json", split, step, metrics, None)
        dist.barrier()
        path = os.path.join(self.out, "eval_results.json")
        if results is not None and not os.path.isfile(path):   # pretraining, no held-out set
            return results
        with open(path, encoding="utf-8") as f:
            evaluated = json.load(f)
        if best_step is not None:
            logger.info(f"best {self._main_metric()} {self.state['best']:.4f} at step "
                        f"{best_step}; results in {self.out}")
        return evaluated

    # -- evaluation only -------------------------------------------------------------------
    def evaluate_only(self):
        """eval_only: the model on eval_splits then test_splits into {split}_results.json, the
        first also into eval_results.json → its metrics."""
        cfg = self.cfg
        log = self._run_log()
        splits = list(dict.fromkeys(list(cfg.eval_splits) + list(cfg.test_splits)))
        first = None
        for split in splits:
            metrics, predictions = self.evaluate(split)
            log.evaluation(split, 0, metrics)
            logger.info(f"eval {split} ({cfg.init_checkpoint}): {_format(metrics)}")
            if self.is_main:
                self._write_results(f"{split}_results.json", split, 0, metrics, predictions)
                if first is None:
                    self._write_results("eval_results.json", split, 0, metrics, None)
            if first is None:
                first = self._record(split, 0, metrics)
        log.close()
        dist.barrier()
        return first


def run(cfg, resume: bool = False):
    """Prepare the run described by `cfg` and train it (or only evaluate, eval_only);
    SIGINT / SIGTERM raise Interrupted (see StopSignals)."""
    signals, trainer, prepared = StopSignals(), None, None
    try:
        with signals.installed():
            # several ranks: one's error before training ends the others with its line
            with peers.telling():
                prepared = prepare(cfg, resume)
            try:
                with peers.telling():
                    trainer = Trainer(prepared)
                    trainer.signals = signals
                    dist.barrier()   # every rank ready to train (or evaluate)
                return trainer.evaluate_only() if cfg.eval_only else trainer.train()
            finally:
                outdir.release_output_dir(prepared.out)   # the lock prepare took (main)
    except Interrupted as e:   # aborted (a second signal, or before training): say where
        if e.output_dir is None and prepared is not None:
            e.output_dir = prepared.out
        if e.step is None and trainer is not None and trainer.state:
            e.step = trainer.state["step"]
            e.finished = trainer.state["step"] == trainer.state["total_steps"]
        raise
