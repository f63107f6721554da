"""Sentence splitting for the English BPE tokenizer.

The official reader encodes every sentence separately (``nltk.tokenize.sent_tokenize``), so
boundaries change token ids. NLTK Punkt when available, else a built-in splitter mimicking it
(one note in the log, at its first use). Where the two differ: docs/design-notes.md, "Sentence
splitting"."""

from __future__ import annotations

import logging
import re
from typing import Callable, List, Optional

logger = logging.getLogger("ernie_doc.tokenization")
# said once per process where someone listens (_note_fallback)
FALLBACK_NOTE = ("sentences: nltk with its punkt data is not installed: the built-in "
                 "rule-based splitter is used; sentence boundaries (and so BPE ids) can differ "
                 "from the official ERNIE-Doc reader (pip install nltk, then "
                 "python -m nltk.downloader punkt)")

__all__ = ["split_sentences", "rule_split_sentences", "nltk_available"]

# --- character classes (the ones Punkt's English language vars use) ----------
# Punctuation that may follow a sentence end and never belongs to a word token.
_NON_WORD = r"""[)";}\]*:@'({\[!?]"""
_MULTI_PUNCT = r"(?:-{2,}|\.{2,}|(?:\.\s){2,}\.)"
# Characters that cannot start a word token (they become one-char tokens).
_NO_WORD_START = "(\"`{[:;&#*@)}]-,"

_CANDIDATE_RE = re.compile(r"[.?!](?=(?P<after>" + _NON_WORD + r"|\s+(?P<next>\S+)))")
_WORD_RE = re.compile(
    _MULTI_PUNCT
    + r"|(?=[^" + re.escape(_NO_WORD_START) + r"])\S+?"
    + r"(?=\s|$|" + _NON_WORD + "|" + _MULTI_PUNCT
    + r"|,(?=$|\s|" + _NON_WORD + "|" + _MULTI_PUNCT + r"))"
    + r"|\S"
)
_NUMBER_RE = re.compile(r"^-?[.,]?\d[\d,.-]*\.?$")
_INITIAL_RE = re.compile(r"^[^\W\d]\.$")
_ELLIPSIS_RE = re.compile(r"^\.\.+$")
_CLOSERS_RE = re.compile(r"""["')\]}]+?(?:\s+|(?=--)|$)""", re.M)
_PUNCT_TOKENS = frozenset(";:,.!?")

# --- hand-written tables -------------------------------------------------------
# Lower-cased, without the final period; single letters listed here never end a sentence.
# "e.g", "i.e", "etc" and "no" are absent: Punkt's English model does not know them either.
_ABBREVIATIONS = frozenset(
    """
    mr mrs ms messrs dr prof rev gen col lt maj sen rep reps gov jr sr st ft mt
    ave bros co corp inc ltd cos vs ok
    jan feb aug sep sept oct nov dec tues wed fri
    calif fla ill mich minn okla ore tenn wis wash conn ariz colo kan nev va
    u.s u.s.a u.k u.n d.c n.y l.a a.m p.m ph.d
    c d e f g h k l m n p r s t v w
    """.split()
)
# Capitalised, these words usually start a sentence, so a preceding
# abbreviation or ellipsis is taken to end one.
_SENTENCE_STARTERS = frozenset(
    """
    the this these there they he it i but however if in when while although
    though yet so since thus instead meanwhile moreover nevertheless
    nonetheless indeed similarly even many most some both nor despite among
    according under
    """.split()
)
# Everyday words: capitalised after an initial ("Plan B. The") they start a sentence,
# unlike a name ("J. Smith").
_COMMON_WORDS = (_SENTENCE_STARTERS - {"i"}) | frozenset(
    """
    she we you a an and or as at by for from of on to with what who why how
    where which that then than all any each every no not one my his her its
    our their your me him us them is was are were be been being have has had
    do does did will would can could should may might must also just only
    still now well after before because until unless here
    """.split()
)


def _is_abbreviation(stem: str) -> bool:
    # "so-called.": Punkt also checks the part after the last hyphen.
    return stem in _ABBREVIATIONS or stem.split("-")[-1] in _ABBREVIATIONS


class _Tok:
    """One Punkt-style word token with the annotations the decisions need."""

    __slots__ = ("text", "sentbreak", "abbr", "ellipsis")

    def __init__(self, text: str):
        self.text = text
        self.sentbreak = False
        self.abbr = False
        self.ellipsis = False

    @property
    def period_final(self) -> bool:
        return self.text.endswith(".")

    @property
    def kind(self) -> str:
        low = self.text.lower()
        return "##number##" if _NUMBER_RE.match(low) else low

    @property
    def kind_no_period(self) -> str:
        k = self.kind
        return k[:-1] if len(k) > 1 and k.endswith(".") else k

    @property
    def kind_no_sentperiod(self) -> str:
        return self.kind_no_period if self.sentbreak else self.kind


def _cannot_start_sentence(tok: _Tok) -> bool:
    """Stand-in for the negative half of Punkt's orthographic heuristic (its positive half
    needs statistics we lack: the main source of disagreement)."""
    # Punkt has usually seen a lower-case word capitalised somewhere, which
    # makes a lower-case occurrence evidence against a sentence start.
    return tok.text in _PUNCT_TOKENS or tok.text[0].islower()


def _context_has_break(context: str) -> bool:
    """Decide, like Punkt, whether ``context`` contains a sentence break
    (a break on its last token does not count)."""
    toks = [_Tok(t) for t in _WORD_RE.findall(context)]
    # First pass: each token alone.
    for tok in toks:
        text = tok.text
        if text in (".", "?", "!"):
            tok.sentbreak = True
        elif _ELLIPSIS_RE.match(text):
            tok.ellipsis = True
        elif tok.period_final and not text.endswith(".."):
            if _is_abbreviation(text[:-1].lower()):
                tok.abbr = True
            else:
                tok.sentbreak = True
    # Second pass: revise a period-final token using the token after it.
    for tok, nxt in zip(toks, toks[1:]):
        if not tok.period_final:
            continue
        initial = bool(_INITIAL_RE.match(tok.text))
        nxt_upper = nxt.text[0].isupper()
        nxt_kind = nxt.kind_no_sentperiod
        if (tok.abbr or tok.ellipsis) and not initial:
            if nxt_upper and nxt_kind in _SENTENCE_STARTERS:
                tok.sentbreak = True
                continue
        if initial or tok.kind_no_period == "##number##":
            if _cannot_start_sentence(nxt):
                tok.sentbreak, tok.abbr = False, True
            elif initial and nxt_upper and nxt_kind not in _COMMON_WORDS:
                # "J. Smith": an initial before a name, not a sentence end.
                tok.sentbreak, tok.abbr = False, True
    return any(tok.sentbreak for tok in toks[:-1])


def rule_split_sentences(text: str) -> List[str]:
    """Split ``text`` with the built-in Punkt-like rules (no NLTK needed)."""
    # Candidates inside one whitespace-free chunk ("!!!", '."') collapse
    # into the last one, whose context starts at the beginning of the chunk.
    candidates = []  # (match, context_start)
    for m in _CANDIDATE_RE.finditer(text):
        if candidates:
            prev_m, prev_start = candidates[-1]
            between = text[prev_m.start():m.start()]
            if not any(c.isspace() for c in between):
                candidates[-1] = (m, prev_start)
                continue
        start = m.start()
        while start > 0 and not text[start - 1].isspace():
            start -= 1
        candidates.append((m, start))

    bounds = []  # (end of sentence, start of the next one)
    for m, start in candidates:
        context = text[start:m.start()] + m.group(0) + m.group("after")
        if _context_has_break(context):
            nxt = m.start("next") if m.group("next") else m.end()
            bounds.append((m.end(), nxt))

    sentences = []
    begin = 0
    for end, nxt in bounds:
        # Closing quotes/brackets after the end belong to this sentence.
        closers = _CLOSERS_RE.match(text, nxt)
        if closers and closers.start() == nxt:
            end = nxt + len(closers.group(0).rstrip())
            nxt = closers.end()
        if begin < end and text[begin:end]:
            sentences.append(text[begin:end])
        begin = max(begin, nxt)
    tail = text[begin:len(text.rstrip())]
    if tail:
        sentences.append(tail)
    return sentences


# --- NLTK detection --------------------------------------------------------------
_nltk_splitter: Optional[Callable[[str], List[str]]] = None
_nltk_checked = False
_fallback_warned = False


def nltk_available() -> bool:
    """True when ``nltk.tokenize.sent_tokenize`` works (package and punkt data)."""
    global _nltk_splitter, _nltk_checked
    if not _nltk_checked:
        _nltk_checked = True
        try:
            from nltk.tokenize import sent_tokenize  # optional dependency

            sent_tokenize("Punkt check. Second sentence.")
            _nltk_splitter = sent_tokenize
        except (ImportError, LookupError, OSError, ValueError):
            # LookupError: nltk installed but punkt/punkt_tab data missing.
            _nltk_splitter = None
    return _nltk_splitter is not None


def _note_fallback() -> bool:
    """Log FALLBACK_NOTE (INFO) when a handler of the ernie_doc loggers takes it (a command's
    notes, a user's own) → whether it was said. Never through the root logger alone: paddle's
    import gives it an INFO handler on stderr, which would put the note on every library
    user's stderr at the first call."""
    node: Optional[logging.Logger] = logger
    while node is not None and node is not logging.root:
        if node.handlers:
            if logger.isEnabledFor(logging.INFO):
                logger.info(FALLBACK_NOTE)
                return True
            return False
        if not node.propagate:
            return False
        node = node.parent
    return False


def split_sentences(text: str, use_nltk: Optional[bool] = None) -> List[str]:
    """Split English ``text`` into sentences. use_nltk: None (NLTK Punkt, else the rule-based
    fallback with one note, FALLBACK_NOTE), False (the fallback), True (NLTK or a
    RuntimeError)."""
    global _fallback_warned
    if use_nltk is False:
        return rule_split_sentences(text)
    if nltk_available():
        return list(_nltk_splitter(text))
    if use_nltk:
        raise RuntimeError("nltk with punkt data is required but not available")
    if not _fallback_warned and _CANDIDATE_RE.search(text):
        _fallback_warned = _note_fallback()
    return rule_split_sentences(text)
