"""The errors this package raises for bad input: one base, ErnieDocError, and a subclass
wherever a caller needs to tell one kind from another.

Every message is one line naming the file, key or argument at fault (a command's one `error:`
line, with the class's `exit_status`). Most are also ValueError, the training ones
RuntimeError, so existing `except` clauses keep working. This module imports nothing."""
from typing import List, Optional


class ErnieDocError(Exception):
    """Bad input to this package (a file, a config key, an argument): the message is one line
    naming it. `exit_status`: what a command exits with after printing it."""
    exit_status = 2


# -- configs and data ---------------------------------------------------------------------------
class ConfigError(ErnieDocError, ValueError):
    """A config key or value that the model cannot use."""


class UntrainedHead(ConfigError):
    """eval_only (or predict) on a checkpoint without the task's head (its predictions would be
    noise). Attributes: checkpoint, head, missing, other_head."""

    def __init__(self, message: str, checkpoint: str, head: str, missing: List[str],
                 other_head: Optional[str]):
        super().__init__(message)
        self.checkpoint, self.head, self.missing = checkpoint, head, missing
        self.other_head = other_head


class DataError(ErnieDocError, ValueError):
    """Bad input data. The message names the file and line (or the key) and what is wrong."""


class DuplicateKey(ErnieDocError, ValueError):
    """A JSON object giving one key twice: json.loads would keep the last value without a word,
    so a hand-edited file would mean what its reader never showed. Raised by json's
    object_pairs_hook (ernie_doc.utils.unique_keys) as 'the key "x" appears twice in one
    object'; each reader puts the file (and line) in front. `key`: that key."""

    def __init__(self, message: str, key: str):
        super().__init__(message)
        self.key = key


class NotSet(DataError):
    """A reader was given an empty path: the config key behind it (data_dir) is not set.
    The task that called the reader turns it into the config's one-line missing-key error."""


class TokenizerError(ErnieDocError, ValueError):
    """A tokenizer file that cannot be used. The message is one line naming the file (and the
    line) and what is wrong; a missing file is a FileNotFoundError instead."""


class SegmenterError(ConfigError):
    """A segmenter refused the reading it was given (layout, room for tokens, answer unit): the
    message names no config key, so the run's reading set-up (kinds.document.setup_reading)
    puts its config file and max_seq_len in front."""


class ModelInputError(ErnieDocError, ValueError):
    """A tensor given to a model or head (input_ids, memories, targets ...) with the wrong
    shape, dtype or values; the message names it."""


# -- checkpoints and released models ------------------------------------------------------------
class CheckpointError(ErnieDocError, ValueError):
    """A checkpoint that cannot be found or read; the message names the path."""


class LoDTensorFormatError(ErnieDocError, ValueError):
    """A file that is not a valid LoDTensor file (message names the file and the problem)."""


class HubError(CheckpointError):
    """A released model or remote file that cannot be fetched, verified or unpacked (one line
    naming the URL or cache path). A CheckpointError, as from_pretrained promises."""


# -- training -----------------------------------------------------------------------------------
class TrainingError(ErnieDocError, RuntimeError):
    """The run cannot go on (non-finite loss ...); a command exits with 1, not 2: the input
    was accepted, the run failed."""
    exit_status = 1


class PeerLost(ErnieDocError, RuntimeError):
    """Several ranks: a peer did not join the process group within peer_join_timeout, or
    stopped on its error before training (the message names it, its node and what to check).
    Exit status 75 (EX_TEMPFAIL, as ernie_doc.peers.PEER_LOST for a rank lost during
    training): the same commands can run again."""
    exit_status = 75


class Bf16ProgramError(TrainingError):
    """A captured CPU bf16 program that must not run (see training.compiled's
    bf16_program_problem)."""


class CheckpointStateError(ErnieDocError, RuntimeError):
    """A resume directory without a usable checkpoint (the message names the file)."""


# -- prediction, export and outputs -------------------------------------------------------------
class PipelineError(ErnieDocError, ValueError):
    """A model directory or document that cannot be predicted; the message is one line."""


class NothingPredicted(PipelineError):
    """`ernie-doc predict` wrote error records alone: no document could be predicted. The
    output holds them, complete (the reason of each); exit status 1, as a TrainingError: the
    input was read, the run did not do its job."""
    exit_status = 1


class ExportError(ErnieDocError, ValueError):
    """A model or argument that cannot be exported, or an export that cannot be loaded (a
    missing, damaged or edited file); one line naming the file."""


class PredictorInputError(ErnieDocError, ValueError):
    """An input to Predictor.run with the wrong shape, dtype or values."""


class EngineError(ErnieDocError, ValueError):
    """A device / precision this host or paddle build cannot run; raised instead of
    paddle.inference's silent fall back to fp32."""


class OutputError(ErnieDocError, ValueError):
    """An output path that would overwrite, alias or block on something; one line."""


class MissingDependency(ErnieDocError, ImportError):
    """An optional package a requested output needs is not installed (matplotlib for a PNG):
    one line saying what to install, or which option skips that output. Also an ImportError."""


class InputError(ErnieDocError):
    """A bad input file or argument value a command found after parsing its arguments: its
    message is the line."""
