"""Run under `paddle.distributed.launch --nproc_per_node 2` (helpers.launch_two_ranks): train,
then dump this rank's parameters and memories so the test can compare the ranks
(helpers.train_and_dump; argv: output directory, then config overrides)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from helpers import train_and_dump  # noqa: E402  (helpers puts the repository on sys.path)

train_and_dump(sys.argv[1], sys.argv[2:])
