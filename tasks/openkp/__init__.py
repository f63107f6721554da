"""OpenKP keyphrase extraction (MS MARCO web pages)."""
