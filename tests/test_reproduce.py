"""docs/reproduce.md has a row for every number of the paper's result tables: the numbers are
transcribed here once, from the paper (Tab. "lm results", "long-text-class-result",
"qa-result", "kp-result", "chinese results", "ab-small-result" and the appendix's
"ab-finetuing"), and each must be the paper cell of a table row whose first cells name it."""
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
