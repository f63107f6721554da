"""Data parallelism through paddle.distributed (launched by `fleetrun` / paddle.distributed.launch;
gloo on CPU, NCCL on GPU). A plain `python` run is world size 1 and touches nothing here."""
import contextlib
import os
from typing import ContextManager, Optional

import paddle
import paddle.distributed as dist

from ernie_doc.errors import ConfigError
from ernie_doc.utils import set_device


def world_size():
    return int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))


def rank():
    return int(os.environ.get("PADDLE_TRAINER_ID", "0"))


def local_size() -> int:
    """Ranks on this node, as the launcher numbers them (PADDLE_LOCAL_SIZE); 0 when it did not
    say."""
    return int(os.environ.get("PADDLE_LOCAL_SIZE") or 0)


def gpu_problem() -> Optional[str]:
    """Why this process cannot run on a GPU (no CUDA in this paddle build, or no GPU visible),
    or None when it can."""
    if not paddle.device.is_compiled_with_cuda():
        return "this paddle build has no CUDA (install paddlepaddle-gpu, or use device cpu)"
    try:
        count = paddle.device.cuda.device_count()
    except Exception as e:   # a CUDA build without a driver  # noqa: BLE001
        return f"no GPU is usable ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    if count < 1:
        return "no GPU is visible (CUDA_VISIBLE_DEVICES, the driver); use device cpu"
    return None


def init(device: str = "auto", bound: Optional[ContextManager] = None) -> str:
    """Pick the device and join the process group when launched with several ranks, inside
    `bound` (`peers.joining`: within a time) → "gpu" or "cpu". device gpu without a usable GPU
    is a ConfigError (run_config.validate reports it first)."""
    problem = gpu_problem() if device in ("gpu", "auto") else None
    if device == "gpu" and problem:
        raise ConfigError(f"device: gpu: {problem}")
    use_gpu = device == "gpu" or (device == "auto" and problem is None)
    if use_gpu:
        local = int(os.environ.get("PADDLE_LOCAL_RANK", os.environ.get("FLAGS_selected_gpus",
                                                                        "0").split(",")[0]))
        set_device(f"gpu:{local}")
    else:
        set_device("cpu")
    if world_size() > 1:
        with bound or contextlib.nullcontext():
            dist.init_parallel_env()
    return "gpu" if use_gpu else "cpu"


def joined() -> bool:
    """Whether this process is one of several ranks of a process group (init ran)."""
    return world_size() > 1 and dist.is_initialized()


def wrap(model):
    # find_unused_parameters: heads that leave part of the model out of the loss would
    # otherwise stall the gradient all-reduce
    if world_size() == 1:
        return model
    return paddle.DataParallel(model, find_unused_parameters=True)


def barrier():
    if world_size() > 1:
        dist.barrier()


def gather_objects(obj):
    """[obj of rank 0, obj of rank 1, ...] on every rank."""
    if world_size() == 1:
        return [obj]
    out = []
    dist.all_gather_object(out, obj)
    return out



def mean_over_ranks(values):
    """[float] → each averaged over all ranks, in one all-reduce (collective: every rank
    must call it)."""
    if world_size() == 1:
        return [float(v) for v in values]
    t = paddle.to_tensor([float(v) for v in values], dtype="float32")
    dist.all_reduce(t)
    return [float(v) / world_size() for v in t.numpy()]
