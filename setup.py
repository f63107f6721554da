import os
import re

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def version():
    """ernie_doc/_version.py, read without importing the package (it imports nothing, but
    setup must not need paddle)."""
    with open(os.path.join(HERE, "ernie_doc", "_version.py"), encoding="utf-8") as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
    README = f.read()

# The task folders (tasks/<name>/: reader.py, config.yaml, run.sh) are installed as the package
# `ernie_doc_tasks` (a generic top-level `tasks` would clash with other distributions); in a
# source checkout they stay importable as `tasks` (ernie_doc.kinds.folders picks the root).
TASKS = ["ernie_doc_tasks"] + ["ernie_doc_tasks." + p for p in find_packages("tasks")]

setup(
    name="ernie-doc-paddle",
    version=version(),
    description="ERNIE-Doc (ACL 2021) for PaddlePaddle: long-document Transformer with "
                "enhanced recurrence, retrospective feed and segment reordering",
    long_description=README,
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=find_packages(include=["ernie_doc", "ernie_doc.*"]) + TASKS,
    package_dir={"ernie_doc_tasks": "tasks"},
    # configs and READMEs travel with the readers; run.sh stays in the checkout (it calls
    # tools/launch.sh): an installed copy runs through `ernie-doc finetune TASK`
    package_data={"ernie_doc_tasks": ["README.md", "*/*.yaml", "*/README.md"]},
    python_requires=">=3.8",
    # Versions are pinned in requirements*.txt; paddle itself is left to the user (CPU or GPU).
    install_requires=["numpy", "regex", "safetensors", "pyyaml", "tqdm", "sentencepiece"],
    # nltk: the version ERNIE-Doc pins, for the CMRC metric's agreement test and for Punkt
    # sentence splitting of BPE text (whose data, `punkt`, is a separate download)
    extras_require={"plot": ["matplotlib"], "visualdl": ["visualdl"], "nltk": ["nltk==3.6.2"]},
    entry_points={"console_scripts": ["ernie-doc=ernie_doc.cli:main"]},
)
