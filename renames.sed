# old module → new module (apply with: sed -E -i -f renames.sed FILES)
# `from ernie_doc.training import X [as Y]` forms first, then dotted paths
s/\bfrom ernie_doc\.training import run_config\b/from ernie_doc import run_config/g
s/\bfrom ernie_doc\.training import amp\b/from ernie_doc import precision as amp/g
s/\bfrom ernie_doc\.training import splits\b/from ernie_doc.data import splits/g
s/\bfrom ernie_doc\.training import distributed\b/from ernie_doc import distributed/g
s/\bfrom ernie_doc\.training import tasks as\b/from ernie_doc.kinds import base as/g
s/\bfrom ernie_doc\.training import tasks\b/from ernie_doc.kinds import base as tasks/g
s/\bfrom ernie_doc\.training import span\b/from ernie_doc.kinds import span/g
s/\bfrom ernie_doc\.training import choice\b/from ernie_doc.kinds import choice/g
s/\bfrom ernie_doc\.training import task_folders\b/from ernie_doc.kinds import folders as task_folders/g
s/\bfrom ernie_doc\.pretraining import task\b/from ernie_doc.kinds import pretraining as task/g
s/\bfrom ernie_doc\.lm import task\b/from ernie_doc.kinds import lm as task/g
s/\bernie_doc\.training\.run_config\b/ernie_doc.run_config/g
s/\bernie_doc\.training\.amp\b/ernie_doc.precision/g
s/\bernie_doc\.training\.splits\b/ernie_doc.data.splits/g
s/\bernie_doc\.training\.distributed\b/ernie_doc.distributed/g
s/\bernie_doc\.training\.tasks\b/ernie_doc.kinds.base/g
s/\bernie_doc\.training\.span\b/ernie_doc.kinds.span/g
s/\bernie_doc\.training\.choice\b/ernie_doc.kinds.choice/g
s/\bernie_doc\.training\.task_folders\b/ernie_doc.kinds.folders/g
s/\bernie_doc\.pretraining\.task\b/ernie_doc.kinds.pretraining/g
s/\bernie_doc\.lm\.task\b/ernie_doc.kinds.lm/g
s/\btraining\/run_config\.py\b/run_config.py/g
s/\btraining\/amp\.py\b/precision.py/g
s/\btraining\/splits\.py\b/data\/splits.py/g
s/\btraining\/distributed\.py\b/distributed.py/g
s/\btraining\/tasks\.py\b/kinds\/base.py/g
s/\btraining\/span\.py\b/kinds\/span.py/g
s/\btraining\/choice\.py\b/kinds\/choice.py/g
s/\btraining\/task_folders\.py\b/kinds\/folders.py/g
s/\bpretraining\/task\.py\b/kinds\/pretraining.py/g
s/\blm\/task\.py\b/kinds\/lm.py/g
# prediction and export: ernie_doc/predict/
s/\bfrom ernie_doc import pipeline as\b/from ernie_doc.predict import pipeline as/g
s/\bfrom ernie_doc import predict_io as\b/from ernie_doc.predict import inputs as/g
s/\bfrom ernie_doc import predict_io\b/from ernie_doc.predict import inputs as predict_io/g
s/\bfrom ernie_doc import inference\b/from ernie_doc.predict import engine as inference/g
s/\bfrom ernie_doc import outputs\b/from ernie_doc.predict import outputs/g
s/\bfrom ernie_doc\.lm import predict\b/from ernie_doc.predict import lm as predict/g
s/\bernie_doc\.pipeline\b/ernie_doc.predict.pipeline/g
s/\bernie_doc\.predict_io\b/ernie_doc.predict.inputs/g
s/\bernie_doc\.outputs\b/ernie_doc.predict.outputs/g
s/\bernie_doc\.inference\b/ernie_doc.predict.engine/g
s/\bernie_doc\.lm\.predict\b/ernie_doc.predict.lm/g
s/\bernie_doc\/pipeline\.py\b/ernie_doc\/predict\/pipeline.py/g
s/\bernie_doc\/predict_io\.py\b/ernie_doc\/predict\/inputs.py/g
s/\bernie_doc\/outputs\.py\b/ernie_doc\/predict\/outputs.py/g
s/\bernie_doc\/inference\.py\b/ernie_doc\/predict\/engine.py/g
s/\bernie_doc\/lm\/predict\.py\b/ernie_doc\/predict\/lm.py/g
s/(^|[^/])\bpredict_io\.py\b/\1predict\/inputs.py/g
s/(^|[^/])\binference\.py\b/\1predict\/engine.py/g
s/(^|[^/])\blm\/predict\.py\b/\1predict\/lm.py/g
# the released names: a leaf module both config and hub read
s/^( *)from ernie_doc\.hub import cache, registry$/\1from ernie_doc import releases as registry\n\1from ernie_doc.hub import cache/
s/\bfrom ernie_doc\.hub import registry\b/from ernie_doc import releases as registry/g
s/\bernie_doc\.hub\.registry\b/ernie_doc.releases/g
s/\bernie_doc\/hub\/registry\.py\b/ernie_doc\/releases.py/g
s/^from ernie_doc\.hub import archive, registry$/from ernie_doc import releases as registry\nfrom ernie_doc.hub import archive/
# functions that moved from training.prepare to assemble (single-name imports only; check
# multi-name imports by hand: grep "training.prepare import")
s/\bfrom ernie_doc\.training\.prepare import (UntrainedHead|build_model|check_head_memory|check_memory|checkpoint_config|choose_tokenizer|resolve_inputs|setup_reading|train_spm|vocabulary_overrides)$/from ernie_doc.assemble import \1/
s/\bprepare\.(check_memory|choose_tokenizer|setup_reading|build_model|check_head_memory|resolve_inputs)\b/assemble.\1/g
# names that moved between modules
s/\bfrom ernie_doc\.run_config import missing_key\b/from ernie_doc.kinds.folders import missing_key/g
s/\bfrom ernie_doc\.predict\.inputs import TASK_FILE$/from ernie_doc.kinds import TASK_FILE/
s/\bfrom ernie_doc\.predict\.engine import export$/from ernie_doc.predict.export import export/
s/\bfrom ernie_doc\.predict\.engine import ExportError$/from ernie_doc.predict.export import ExportError/
s/\bfrom ernie_doc\.auto import (register_kind|kind_name|kind_class|kind_names)\b/from ernie_doc.kinds import \1/g
s/\bfrom ernie_doc\.kinds\.base import build_task$/from ernie_doc.kinds import build_task/
s/\bfrom ernie_doc\.kinds\.base import ClassificationTask$/from ernie_doc.kinds.classification import ClassificationTask/
