"""Run by test_training.py under `paddle.distributed.launch --nproc_per_node 2`: fine-tune,
then dump this rank's parameters and memories so the test can compare the ranks."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from ernie_doc.training import distributed as dist  # noqa: E402
from ernie_doc.training.prepare import prepare  # noqa: E402
from ernie_doc.training.run_config import load_config  # noqa: E402
from ernie_doc.training.trainer import Trainer  # noqa: E402

out = sys.argv[1]
trainer = Trainer(prepare(load_config(None, sys.argv[2:] + [f"output_dir={out}"])))
trainer.train()
params = {k: v.numpy() for k, v in trainer.model.state_dict().items()}
np.savez(os.path.join(out, f"params-rank{dist.rank()}.npz"), **params)
np.save(os.path.join(out, f"memories-rank{dist.rank()}.npy"), trainer.last_memories)
