"""A required key left empty is one line naming the config file and the key, what it holds
and how to set it (`--set key=...`, and run.sh's environment variable where there is one),
exit 2, before anything is written."""
import pytest
from helpers import ROOT, exits, listing, one_error_line

SMALL = ["model=ernie-doc-small", "progress=false",
         "model_overrides={num_hidden_layers: 1, hidden_size: 16, num_attention_heads: 2}"]
READS_DATA = ["c3", "cail2019_scm", "cmrc2018", "drcd", "dureader", "hotpotqa", "hyp",
              "iflytek", "imdb", "openkp", "thucnews", "triviaqa", "wikitext103"]


def finetune(tmp_path, config, *overrides):
    from tools.finetune import main
    out = tmp_path / "out"
    exits(2, lambda: main([str(ROOT / config), "--set", f"output_dir={out}", *overrides]))
    assert listing(tmp_path) == []   # nothing written, the output directory not created


def vocab(tmp_path):
    directory = tmp_path.parent / (tmp_path.name + "-vocab")
    directory.mkdir()
    (directory / "vocab.txt").write_text("[PAD]\n[CLS]\n[SEP]\n[MASK]\n[UNK]\na\n")
    return str(directory)


@pytest.mark.parametrize("task", READS_DATA)
def test_unset_data_dir_says_how_to_set_it(task, tmp_path, capsys):
    model = ["model_overrides={n_layer: 1}"] if task == "wikitext103" else \
        [f"tokenizer={vocab(tmp_path)}", *SMALL]
    finetune(tmp_path, f"tasks/{task}/config.yaml", *model)
    line = one_error_line(capsys, f"tasks/{task}/config.yaml: data_dir is not set: the {task} "
                                  f"task reads its data from a directory",
                          f"give it with --set data_dir=..., or DATA_DIR=... bash "
                          f"tasks/{task}/run.sh")
    assert ": : " not in line


def test_the_empty_path_itself_is_never_the_message():
    from ernie_doc.data.document import require_dir
    from ernie_doc.errors import NotSet
    with pytest.raises(NotSet, match="^the data directory is not set$"):
        require_dir("")


def test_unset_pretraining_corpus(tmp_path, capsys):
    finetune(tmp_path, "configs/pretrain/base.yaml", f"tokenizer={vocab(tmp_path)}",
             "max_steps=1", *SMALL)
    one_error_line(capsys, "configs/pretrain/base.yaml: data_dir is not set: the pretraining "
                           "corpus", "give it with --set data_dir=...")


def test_eval_only_without_init_checkpoint(tmp_path, capsys):
    finetune(tmp_path, "tasks/imdb/config.yaml", "eval_only=true")
    one_error_line(capsys, "tasks/imdb/config.yaml: init_checkpoint is not set: eval_only "
                           "evaluates it", "--set init_checkpoint=..., or INIT_CHECKPOINT=... "
                                           "bash tasks/imdb/run.sh")


def test_tokenizer_without_a_source(tmp_path, capsys):
    data = tmp_path.parent / (tmp_path.name + "-data")
    data.mkdir()
    (data / "train.json").write_text('{"label": "1", "sentence": "a"}\n')
    (data / "dev.json").write_text('{"label": "0", "sentence": "a"}\n')
    finetune(tmp_path, "tasks/iflytek/config.yaml", f"data_dir={data}", *SMALL)
    one_error_line(capsys, "tasks/iflytek/config.yaml: tokenizer is not set: model "
                           "'ernie-doc-small' is not a released model",
                   "give it with --set tokenizer=...")


def test_hotpotqa_stage_two_without_evidence(tmp_path, capsys):
    data = tmp_path.parent / (tmp_path.name + "-data")
    data.mkdir()
    finetune(tmp_path, "tasks/hotpotqa/config_answer.yaml", f"data_dir={data}",
             "task_options.evidence_file=null",
             f"tokenizer={vocab(tmp_path)}", *SMALL)
    one_error_line(capsys, "config_answer.yaml: task_options.evidence_file is not set: stage "
                           "answer reads stage 1's predictions",
                   "--set task_options.evidence_file=..., or STAGE=answer EVIDENCE=... bash "
                   "tasks/hotpotqa/run.sh")
