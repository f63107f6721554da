from ernie_doc.modeling.model import ErnieDocModel, ErnieDocOutput  # noqa: F401
