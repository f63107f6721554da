"""from_pretrained / save_pretrained: the one door for weights (filled in by ernie_doc.checkpoint)."""


class PretrainedMixin:
    pass
