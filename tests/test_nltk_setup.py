"""The offline NLTK tagger: plain `nltk.pos_tag` works with it on unseen captions, re-installing
is a no-op, and a machine without tagger data gets the exact download command."""

from __future__ import annotations

import os
import subprocess
import sys

import nltk

from builders.cli import main as cli_main
from builders.text.nltk_setup import DOWNLOAD_COMMAND, STAMP, TAGGER_DIR, install_offline_tagger

# Held-out captions (not in the shipped corpus), hand-tagged for this test.
HELD_OUT = [
    "A/DT man/NN riding/VBG a/DT wave/NN on/IN a/DT surfboard/NN",
    "Two/CD dogs/NNS fighting/VBG over/IN a/DT frisbee/NN",
    "A/DT plate/NN with/IN broccoli/NN and/CC a/DT fork/NN on/IN a/DT wooden/JJ table/NN",
    "A/DT cat/NN laying/VBG on/IN a/DT laptop/NN keyboard/NN",
    "Several/JJ giraffes/NNS standing/VBG in/IN a/DT field/NN near/IN trees/NNS",
    "A/DT woman/NN holding/VBG an/DT umbrella/NN on/IN a/DT busy/JJ street/NN",
    "A/DT red/JJ bus/NN parked/VBN next/JJ to/TO a/DT fire/NN hydrant/NN",
    "Three/CD elephants/NNS walking/VBG across/IN the/DT grass/NN",
    "A/DT kitchen/NN with/IN a/DT white/JJ refrigerator/NN and/CC an/DT oven/NN",
    "A/DT boy/NN throwing/VBG a/DT ball/NN to/TO his/PRP$ dog/NN",
]


def test_pos_tag_tags_unseen_caption_nouns(nltk_data_dir):
    assert nltk_data_dir.joinpath(TAGGER_DIR, STAMP).exists()
    gold_nouns = tagged_nouns = 0
    correct = total = 0
    for line in HELD_OUT:
        gold = [tuple(t.rsplit("/", 1)) for t in line.split()]
        predicted = nltk.pos_tag([w for w, _ in gold])
        for (word, g), (_, p) in zip(gold, predicted):
            total += 1
            correct += g == p
            if g.startswith("NN"):
                gold_nouns += 1
                tagged_nouns += p.startswith("NN")
    assert tagged_nouns / gold_nouns >= 0.9
    assert correct / total >= 0.8


def test_reinstall_is_a_noop_and_cli_reports_the_tagger(nltk_data_dir, capsys):
    model = next(nltk_data_dir.joinpath(TAGGER_DIR).glob("*.json"))
    mtime = model.stat().st_mtime_ns
    install_offline_tagger(nltk_data_dir)
    assert model.stat().st_mtime_ns == mtime
    assert cli_main(["nltk", "offline-tagger", "--nltk-data", str(nltk_data_dir)]) == 0
    assert model.stat().st_mtime_ns == mtime
    assert cli_main(["nltk", "check"]) == 0
    assert "offline caption tagger" in capsys.readouterr().out


def test_missing_tagger_data_names_the_download_command(tmp_path):
    # A fresh interpreter with an empty NLTK_DATA (nltk caches its search path at import).
    env = {**os.environ, "NLTK_DATA": str(tmp_path), "HOME": str(tmp_path)}
    cli = os.path.join(os.path.dirname(sys.executable), "counterfactory")
    proc = subprocess.run([cli, "nltk", "check"], env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert DOWNLOAD_COMMAND in proc.stderr and "Traceback" not in proc.stderr


def test_offline_tagger_cli_installs_into_a_new_folder(tmp_path):
    target = tmp_path / "nd"
    assert cli_main(["nltk", "offline-tagger", "--nltk-data", str(target)]) == 0
    assert target.joinpath(TAGGER_DIR, STAMP).exists()
