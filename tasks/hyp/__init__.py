"""SemEval-2019 Task 4 Hyperpartisan News Detection (by-article)."""
