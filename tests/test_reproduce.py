"""docs/reproduce.md has a row for every number of the paper's result tables: the numbers are
transcribed here once, from the paper (Tab. "lm results", "long-text-class-result",
"qa-result", "kp-result", "chinese results", "ab-small-result" and the appendix's
"ab-finetuing"), and each must be the paper cell of a table row whose first cells name it.
A row's estimate is what its `tools/plan.py` command prints, and that command plans the run
the row's command launches (config, GPUs, overrides; the ablation's: configs/ablation.yaml)."""
import contextlib
import io
import re
import shlex

import pytest
from helpers import ROOT

PAGE = ROOT / "docs" / "reproduce.md"

# (dataset or variant, model or task, metric, the paper's number): a row's first four cells
PAPER = [
    ("WikiText-103", "base", "test PPL", "21.0"), ("WikiText-103", "large", "test PPL", "16.8"),
    ("IMDB", "base", "Acc.", "96.1"), ("IMDB", "base", "F1", "96.1"),
    ("Hyperpartisan", "base", "F1", "96.3"),
    ("IMDB", "large", "Acc.", "97.1"), ("IMDB", "large", "F1", "97.1"),
    ("Hyperpartisan", "large", "F1", "96.6"),
    ("TriviaQA", "base", "F1", "80.1"), ("HotpotQA", "base", "Span F1", "79.4"),
    ("HotpotQA", "base", "Supp F1", "86.3"), ("HotpotQA", "base", "Joint F1", "70.5"),
    ("TriviaQA", "large", "F1", "82.5"), ("HotpotQA", "large", "Span F1", "82.2"),
    ("HotpotQA", "large", "Supp F1", "87.6"), ("HotpotQA", "large", "Joint F1", "73.7"),
    ("OpenKP", "base", "F1@1", "40.2"), ("OpenKP", "base", "F1@3", "40.5"),
    ("OpenKP", "base", "F1@5", "34.4"),
    ("DRCD", "base", "dev EM", "90.5"), ("DRCD", "base", "dev F1", "95.2"),
    ("DRCD", "base", "test EM", "90.5"), ("DRCD", "base", "test F1", "95.1"),
    ("CMRC2018", "base", "dev EM", "76.1"), ("CMRC2018", "base", "dev F1", "91.6"),
    ("DuReader", "base", "dev EM", "65.8"), ("DuReader", "base", "dev F1", "77.9"),
    ("CAIL", "base", "dev Acc.", "65.6"), ("CAIL", "base", "test Acc.", "68.8"),
    ("THU", "base", "dev Acc.", "98.3"), ("THU", "base", "test Acc.", "97.7"),
    ("IFK", "base", "dev Acc.", "62.4"),
    ("C3", "base", "dev Acc.", "76.5"), ("C3", "base", "test Acc.", "76.5"),
]
ABLATION = {   # variant: TriviaQA F1, HotpotQA joint F1, IMDB accuracy, HYP F1, their mean
    "#0": ("64.56", "50.85", "93.14", "86.10", "73.66"),
    "#1": ("63.59", "50.04", "93.15", "84.60", "72.85"),
    "#2": ("63.38", "49.87", "92.56", "83.27", "72.27"),
    "#3": ("61.09", "44.05", "92.07", "81.67", "69.72"),
    "#4": ("58.35", "31.54", "91.60", "77.72", "64.80"),
}
TASKS = (("TriviaQA", "F1"), ("HotpotQA", "Joint F1"), ("IMDB", "Acc."), ("Hyperpartisan", "F1"),
         ("Avg.", "–"))
PAPER += [(variant, task, metric, number) for variant, numbers in ABLATION.items()
          for (task, metric), number in zip(TASKS, numbers)]


def table_rows(text):
    """The first four cells of every table row of a markdown page (header rows included)."""
    return [tuple(c.strip() for c in line.strip().strip("|").split("|"))[:4]
            for line in text.splitlines() if line.lstrip().startswith("|")]


def test_every_paper_number_has_a_row():
    rows = table_rows(PAGE.read_text(encoding="utf-8"))
    missing = [number for number in PAPER if number not in rows]
    assert not missing, f"paper numbers without a row in {PAGE.name}: {missing}"
    assert len(PAPER) == 34 + 25 and len(set(PAPER)) == len(PAPER)


def test_a_missing_row_is_found():
    text = PAGE.read_text(encoding="utf-8").replace("| C3 | base | test Acc. | 76.5 |",
                                                   "| C3 | base | test Acc. | 76.4 |")
    assert ("C3", "base", "test Acc.", "76.5") not in table_rows(text)


# -- the estimates: each row's plan command, run here, prints the row's figure -----------------
PLAN = "python tools/plan.py "


def rows_with_commands():
    """(row text, its plan commands' arguments, its run.sh commands) of every table row."""
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        spans = re.findall(r"`([^`]+)`", line) if line.startswith("|") else []
        plans = [shlex.split(s[len(PLAN):]) for s in spans if s.startswith(PLAN)]
        if plans:
            yield line, plans, [s for s in spans if " bash tasks/" in f" {s}"]


@pytest.fixture(scope="module")
def planned():
    """{plan arguments: what tools/plan.py prints}, every command of the page run once."""
    from ernie_doc.cli.plan import main
    printed = {}
    for _, plans, _ in rows_with_commands():
        for argv in plans:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):   # the config's path from the checkout
                assert main([str(ROOT / argv[0]), *argv[1:]]) == 0
            printed[tuple(argv)] = out.getvalue()
    return printed


def test_every_estimate_is_what_its_command_prints(planned):
    assert len(planned) >= 40
    for line, plans, _ in rows_with_commands():
        for argv in plans:
            hours = re.search(r"GPU-hours \(estimate\): (\S+)", planned[tuple(argv)]).group(1)
            assert f"{hours} GPU-h" in line, (hours, argv)


def plan_args(argv):
    from ernie_doc.cli.plan import parse_args
    args = parse_args(argv)
    return args.config, args.gpus, args.overrides


def test_each_estimate_plans_the_run_its_row_launches():
    """A run.sh command and the first plan command of its row: the same config (SIZE, STAGE,
    CONFIG as tools/launch.sh picks it), NPROC GPUs, its overrides among the plan's; a second
    plan command is HotpotQA's answer stage with the same settings."""
    checked = 0
    for line, plans, runs in rows_with_commands():
        if not runs:
            continue
        words = shlex.split(runs[0])
        at = words.index("bash")
        env = dict(w.split("=", 1) for w in words[:at])
        name = env.get("CONFIG", "config_answer.yaml" if env.get("STAGE") == "answer"
                       else "config.yaml")
        if env.get("SIZE") == "large":
            name = name.replace(".yaml", "_large.yaml")
        config, gpus, overrides = plan_args(plans[0])
        assert config == words[at + 1].replace("run.sh", name), line
        assert gpus == int(env.get("NPROC", 1)) and set(words[at + 2:]) <= set(overrides), line
        if len(plans) > 1:
            assert plan_args(plans[1]) == (config.replace("/config", "/config_answer"), gpus,
                                           overrides), line
        checked += 1
    assert checked == 18   # every row with a run.sh command (the ablation's: below)


def test_the_ablation_estimates_plan_the_override_sets_of_configs_ablation_yaml():
    import yaml
    sets = yaml.safe_load((ROOT / "configs" / "ablation.yaml").read_text(encoding="utf-8"))
    checked = set()
    for line, plans, _ in rows_with_commands():
        if not re.match(r"\| #\d ", line):   # the ablation's tables: "#0 `0_full`", "#0 | IMDB"
            continue
        name = re.search(r"`(\d_\w+)`", line).group(1)
        section = "pretrain" if plans[0][0].startswith("configs/") else "finetune"
        for argv in plans:
            overrides = [o for o in plan_args(argv)[2] if o != "model=ernie-doc-small"]
            assert overrides == sets[section][name], (section, name, argv)
        checked.add((section, name))
    assert checked == {("pretrain", n) for n in sets["pretrain"]} | {
        ("finetune", n) for n in ("0_full", "2_no_so_retro", "4_no_so_retro_recur")}
