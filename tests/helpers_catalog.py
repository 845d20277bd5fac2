"""Tiny experiment files for the batch tests: sklearn digits (or another dataset), 3 clients, a one-round
FedAvg pretraining ("Global") and fine-tuning stages that start from it, so a whole run takes seconds."""
from __future__ import annotations

from pathlib import Path

HEAD = """\
[experiment]
paper = "tiny"
table = "Table 1"
title = "{title}"

[data]
dataset = "{dataset}"
scheme = "dirichlet"
num_clients = 3

[data.partition]
alpha = 1.0

[model]
name = "digits_cnn"

[pretrain]
label = "Global"
algorithm = "fedavg"
rounds = {rounds}
fraction = 1.0
lr = 0.05
batch_size = 32
local_epochs = 1
eval_every = 0
keep_best = false
"""

FT = """
[methods."FT (BN {short})"]
algorithm = "finetune"
bn = "{bn}"
epochs = {epochs}
lr = 0.01
batch_size = 32
"""


def tiny_toml(*, dataset: str = "digits", title: str = "digits, 3 clients, one round", rounds: int = 1,
              ft: dict[str, int] | None = None, published: dict[str, float] | None = None) -> str:
    """The text of a tiny experiment file: ``ft`` maps each fine-tuning BN mode to its epochs
    (``{"client": 1}``: FT (BN C) only, the default); ``published`` the paper's numbers by label."""
    short = {"client": "C", "global": "G", "batch": "I"}
    text = HEAD.format(title=title, dataset=dataset, rounds=rounds)
    text += "".join(FT.format(short=short[bn], bn=bn, epochs=e) for bn, e in (ft or {"client": 1}).items())
    if published:
        text += "\n[published]\n" + "".join(f'"{k}" = {v}\n' for k, v in published.items())
    return text


def write_toml(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
