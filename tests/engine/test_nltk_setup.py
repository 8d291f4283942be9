"""The offline NLTK tagger: plain `nltk.pos_tag` works with it on unseen captions, re-installing
is a no-op, and a machine without tagger data gets the exact download command."""

from __future__ import annotations

import os
import subprocess
import sys

import nltk
import pytest

from builders.app.cli import main as cli_main
from builders.engine.nltk_setup import DOWNLOAD_COMMAND, STAMP, TAGGER_DIR, install_offline_tagger, read_tagged_corpus

# Held-out captions (none is in the shipped corpus), hand-tagged for this test.
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
    "A/DT man/NN standing/VBG on/IN a/DT boat/NN holding/VBG a/DT fishing/NN pole/NN ./.",
    "The/DT little/JJ girl/NN is/VBZ feeding/VBG a/DT giraffe/NN at/IN the/DT zoo/NN ./.",
    "An/DT old/JJ truck/NN sitting/VBG in/IN a/DT field/NN of/IN weeds/NNS ./.",
    "A/DT woman/NN sitting/VBG on/IN a/DT bench/NN reading/VBG a/DT newspaper/NN ./.",
    "Two/CD cats/NNS curled/VBN up/RP on/IN a/DT blanket/NN ./.",
    "A/DT bunch/NN of/IN motorcycles/NNS parked/VBN along/IN a/DT curb/NN ./.",
    "A/DT tray/NN of/IN cupcakes/NNS with/IN pink/JJ frosting/NN ./.",
    "A/DT kid/NN on/IN a/DT skateboard/NN in/IN a/DT parking/NN lot/NN ./.",
    "Horses/NNS grazing/VBG in/IN a/DT pasture/NN near/IN a/DT barn/NN ./.",
    "A/DT teddy/NN bear/NN sitting/VBG on/IN a/DT wooden/JJ chair/NN ./.",
    "A/DT cluttered/JJ desk/NN with/IN two/CD monitors/NNS and/CC a/DT lamp/NN ./.",
    "A/DT man/NN is/VBZ cooking/VBG food/NN on/IN a/DT grill/NN ./.",
    "The/DT sun/NN is/VBZ setting/VBG behind/IN the/DT mountains/NNS ./.",
    "A/DT double/JJ decker/NN bus/NN driving/VBG past/IN a/DT church/NN ./.",
    "A/DT pizza/NN sitting/VBG on/IN top/NN of/IN a/DT stove/NN ./.",
    "Children/NNS playing/VBG soccer/NN on/IN a/DT sunny/JJ day/NN ./.",
    "A/DT bear/NN is/VBZ swimming/VBG in/IN a/DT river/NN ./.",
    "A/DT snowboarder/NN flying/VBG through/IN the/DT air/NN ./.",
    "A/DT white/JJ toilet/NN next/JJ to/TO a/DT bathtub/NN ./.",
    "Several/JJ people/NNS waiting/VBG at/IN an/DT airport/NN terminal/NN ./.",
    "A/DT man/NN in/IN a/DT hat/NN is/VBZ selling/VBG fruit/NN at/IN a/DT market/NN ./.",
    "A/DT banana/NN and/CC an/DT orange/NN on/IN a/DT napkin/NN ./.",
    "A/DT dog/NN sticking/VBG its/PRP$ head/NN out/IN of/IN a/DT car/NN window/NN ./.",
    "Three/CD women/NNS holding/VBG umbrellas/NNS in/IN the/DT rain/NN ./.",
    "A/DT cow/NN laying/VBG down/RP in/IN the/DT grass/NN ./.",
    "An/DT empty/JJ bench/NN in/IN a/DT snowy/JJ park/NN ./.",
    "A/DT clock/NN hanging/VBG from/IN the/DT ceiling/NN of/IN a/DT train/NN station/NN ./.",
    "A/DT girl/NN brushing/VBG her/PRP$ teeth/NNS in/IN front/NN of/IN a/DT mirror/NN ./.",
    "A/DT room/NN with/IN a/DT bed/NN ,/, a/DT desk/NN and/CC a/DT chair/NN ./.",
    "The/DT elephants/NNS are/VBP drinking/VBG water/NN from/IN a/DT pond/NN ./.",
    "A/DT surfboard/NN leaning/VBG against/IN a/DT fence/NN ./.",
    "A/DT sandwich/NN and/CC fries/NNS on/IN a/DT white/JJ plate/NN ./.",
    "A/DT batter/NN waiting/VBG for/IN the/DT pitch/NN at/IN home/NN plate/NN ./.",
    "A/DT small/JJ bird/NN perched/VBN on/IN a/DT wire/NN ./.",
    "A/DT wine/NN glass/NN filled/VBN with/IN red/JJ wine/NN ./.",
    "A/DT person/NN skiing/VBG down/IN a/DT steep/JJ hill/NN ./.",
    "Some/DT zebras/NNS drinking/VBG from/IN a/DT watering/NN hole/NN ./.",
    "A/DT man/NN talking/VBG on/IN his/PRP$ phone/NN while/IN walking/VBG his/PRP$ dog/NN ./.",
    "A/DT cake/NN with/IN candles/NNS on/IN a/DT table/NN ./.",
    "A/DT red/JJ and/CC white/JJ boat/NN on/IN the/DT water/NN ./.",
]


def test_pos_tag_tags_unseen_caption_nouns(nltk_data_dir):
    assert nltk_data_dir.joinpath(TAGGER_DIR, STAMP).exists()
    gold = [[tuple(t.rsplit("/", 1)) for t in line.split()] for line in HELD_OUT]
    # Held out for real: no test sentence may be (a case variant of) a training sentence.
    seen = {" ".join(w.lower() for w, _ in s if w != ".") for s in read_tagged_corpus()}
    assert not [s for s in gold if " ".join(w.lower() for w, _ in s if w != ".") in seen]
    gold_nouns = tagged_nouns = correct = total = 0
    for sentence in gold:
        predicted = nltk.pos_tag([w for w, _ in sentence])  # the plain NLTK API, no tagger object
        for (_, g), (_, p) in zip(sentence, predicted, strict=True):
            total += 1
            correct += g == p
            if g.startswith("NN"):
                gold_nouns += 1
                tagged_nouns += p.startswith("NN")
    assert tagged_nouns / gold_nouns >= 0.9
    assert correct / total >= 0.9


def test_reinstall_is_a_noop_and_cli_reports_the_tagger(nltk_data_dir, capsys):
    model = next(nltk_data_dir.joinpath(TAGGER_DIR).glob("*.json"))
    mtime = model.stat().st_mtime_ns
    install_offline_tagger(nltk_data_dir)
    assert model.stat().st_mtime_ns == mtime
    assert cli_main(["nltk", "offline-tagger", "--nltk-data", str(nltk_data_dir)]) == 0
    assert model.stat().st_mtime_ns == mtime
    assert cli_main(["nltk", "check"]) == 0
    assert "offline caption tagger" in capsys.readouterr().out


@pytest.mark.e2e
def test_missing_tagger_data_names_the_download_command(tmp_path):
    # A fresh interpreter (nltk fixes its search path at import) whose NLTK_DATA is an empty
    # folder; the system-wide folders are dropped too, so a machine that has the real tagger
    # installed still exercises the missing-data path.
    env = {**os.environ, "NLTK_DATA": str(tmp_path), "HOME": str(tmp_path)}
    code = (
        "import sys, nltk; nltk.data.path[:] = [sys.argv[1]]; from builders.app.cli import main; "
        "sys.exit(main(['nltk', 'check']))"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert DOWNLOAD_COMMAND in proc.stderr and "counterfactory nltk offline-tagger" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_offline_tagger_cli_installs_into_a_new_folder(tmp_path):
    target = tmp_path / "nd"
    assert cli_main(["nltk", "offline-tagger", "--nltk-data", str(target)]) == 0
    assert target.joinpath(TAGGER_DIR, STAMP).exists()


@pytest.mark.e2e
def test_offline_tagger_installs_where_nltk_looks_by_default(tmp_path):
    # No NLTK_DATA anywhere: the tagger goes to NLTK's own download folder (~/nltk_data, with HOME
    # pointed at tmp_path) and a fresh process with no settings finds it. NLTK's system-wide
    # folders are dropped from its search path so the test never writes outside tmp_path.
    env = {k: v for k, v in os.environ.items() if k != "NLTK_DATA"} | {"HOME": str(tmp_path)}
    code = (
        "import sys, nltk; nltk.data.path[:] = [p for p in nltk.data.path if p.startswith(sys.argv[1])]; "
        "from builders.app.cli import main; sys.exit(main(sys.argv[2:]))"
    )

    def counterfactory(*argv):
        return subprocess.run(
            [sys.executable, "-c", code, str(tmp_path), *argv], env=env, capture_output=True, text=True
        )

    installed = counterfactory("nltk", "offline-tagger")
    assert installed.returncode == 0, installed.stderr
    assert (tmp_path / "nltk_data").joinpath(TAGGER_DIR, STAMP).exists()
    check = counterfactory("nltk", "check")
    assert check.returncode == 0, check.stderr
    assert "offline caption tagger" in check.stdout


def test_offline_tagger_never_replaces_the_real_tagger(tmp_path):
    real = tmp_path.joinpath(TAGGER_DIR)
    real.mkdir(parents=True)
    weights = real / "averaged_perceptron_tagger_eng.weights.json"
    weights.write_text("{}")  # stands in for the downloaded data (no counterfactory stamp)
    assert cli_main(["nltk", "offline-tagger", "--nltk-data", str(tmp_path)]) == 0
    assert weights.read_text() == "{}" and not real.joinpath(STAMP).exists()
