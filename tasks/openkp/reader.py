"""OpenKP keyphrase extraction from web pages (MS MARCO, Xiong et al. 2019).

JSON lines `{"url": str, "text": str (words separated by whitespace), "VDOM": str (visual
features, ignored), "KeyPhrases": [[word, ...], ...]}`; KeyPhrases is absent in the eval file.
Blank lines are skipped. Files: OpenKPTrain.jsonl, OpenKPDev.jsonl, OpenKPEvalPublic.jsonl.

The paper cleans the text by removing nonsense words such as HTTP links: with remove_urls, a
word that starts with http://, https:// or www. (case-insensitive, after leading punctuation
such as "(") is dropped. Keyphrases are matched against the cleaned words.

Document: doc_id = url; text = the cleaned words joined by " "; label None; fields:
  words                [str], the cleaned words
  keyphrases           [[str]] as given ([] when the file has none)
  keyphrase_positions  [[start word, end word inclusive], ...]: every occurrence of every gold
                       phrase in words, case-insensitive (a phrase's items are re-split on
                       whitespace), sorted, each span once

Bad input: a malformed line, a missing or empty url, a missing or empty text, malformed
KeyPhrases, and (train / dev) missing KeyPhrases are DataErrors "file:line: ...". Counted skips
(one warning line per reason): a repeated url (the public files repeat some: 6 in dev, ~1,200 in
train; one record per url is kept, so doc_ids stay unique), a text left without words once URLs
are removed, and a train document none of whose keyphrases occur.

A repeated url keeps its last record, as the official MS MARCO OpenKP evaluate.py
(microsoft/OpenKP) does when it loads the reference file into a dict keyed by url; the document
keeps the place of the url's first record (the dict's order). Every record is still checked.

Options:
  files         {split: file name} instead of the names above
  remove_urls   drop URL words (default true)
"""
import re

from ernie_doc.data.document import (Document, Skips, check_options, pick_file, read_json_lines,
                                     where)
from ernie_doc.errors import DataError

FILES = {"train": ["OpenKPTrain.jsonl"],
         "dev": ["OpenKPDev.jsonl"],
         "test": ["OpenKPEvalPublic.jsonl"]}
OPTIONS = ("files", "remove_urls")
URL = re.compile(r"^\W*(?:https?://|www\.)", re.IGNORECASE)


def read(data_dir, split, options):
    options = check_options(options, OPTIONS)
    path = pick_file(data_dir, split, FILES, options.get("files"))
    remove_urls = options.get("remove_urls", True)
    if not isinstance(remove_urls, bool):
        raise DataError(f"reader option 'remove_urls': expected true or false, got "
                        f"{remove_urls!r}")
    skips = Skips(path, "documents")
    kept, total = {}, 0    # url -> (line, words, keyphrases), in the order urls first appear
    for line, record in read_json_lines(path):
        total += 1
        url = record.get("url")
        if not isinstance(url, str) or not url.strip():
            raise DataError(f"{where(path, line)}: 'url' is missing, empty or not a string")
        text = record.get("text")
        if not isinstance(text, str):
            raise DataError(f"{where(path, line)}: 'text' is missing or not a string")
        words = text.split()
        if not words:
            raise DataError(f"{where(path, line)}: empty text")
        keyphrases = _keyphrases(record, split, path, line)
        if url in kept:
            # the skip names the record that is dropped
            skips.add("repeated url (the last record is kept)", where(path, kept[url][0]))
        kept[url] = (line, words, keyphrases)
    docs = []
    for url, (line, words, keyphrases) in kept.items():
        if remove_urls:
            words = [w for w in words if not URL.match(w)]
            if not words:
                skips.add("no words left once URLs are removed", where(path, line))
                continue
        positions = find_phrases(words, keyphrases)
        if split == "train" and not positions:
            skips.add("none of its keyphrases occurs in the text", where(path, line))
            continue
        fields = {"words": words, "keyphrases": keyphrases, "keyphrase_positions": positions}
        docs.append(Document(url, " ".join(words), None, fields=fields))
    skips.report(total)
    if not docs:
        raise DataError(f"{where(path)}: no examples for split {split!r}")
    return docs


def _keyphrases(record, split, path, line):
    if "KeyPhrases" not in record:
        if split != "test":
            raise DataError(f"{where(path, line)}: record has no 'KeyPhrases' (only the eval "
                            f"file, read as test, may lack them)")
        return []
    phrases = record["KeyPhrases"]
    if (not isinstance(phrases, list) or not all(isinstance(p, list) for p in phrases)
            or not all(isinstance(w, str) for p in phrases for w in p)):
        raise DataError(f"{where(path, line)}: 'KeyPhrases' is not a list of lists of words")
    return [list(p) for p in phrases]


def find_phrases(words, phrases):
    """Sorted [[start, end inclusive]] of every case-insensitive occurrence of each phrase."""
    lowered = [w.lower() for w in words]
    starts = {}
    for i, word in enumerate(lowered):
        starts.setdefault(word, []).append(i)
    found = set()
    for phrase in phrases:
        # Items are words, but a stray space inside one would otherwise never match.
        target = " ".join(phrase).lower().split()
        if not target:
            continue
        n = len(target)
        for i in starts.get(target[0], ()):
            if lowered[i:i + n] == target:
                found.add((i, i + n - 1))
    return [list(span) for span in sorted(found)]
