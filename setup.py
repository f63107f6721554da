from setuptools import find_packages, setup

setup(
    name="ernie-doc-paddle",
    version="0.1.0",
    description="ERNIE-Doc (ACL 2021) for PaddlePaddle: long-document Transformer with "
                "enhanced recurrence, retrospective feed and segment reordering",
    packages=find_packages(include=["ernie_doc", "ernie_doc.*"]),
    python_requires=">=3.8",
    # Versions are pinned in requirements*.txt; paddle itself is left to the user (CPU or GPU).
    install_requires=["numpy", "regex", "safetensors", "pyyaml", "tqdm", "sentencepiece"],
)
