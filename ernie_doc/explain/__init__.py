"""Attribution: which segments and words of a document drove a prediction (`ernie-doc explain`)."""
