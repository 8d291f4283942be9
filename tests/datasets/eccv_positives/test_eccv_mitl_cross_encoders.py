"""BLIP and FLAVA as machine annotators through `counterfactory eccv candidates`, each ranking as
its own paper does (BLIP: its ITC top --rerank-k re-ranked by ITM logit + ITC, as its
`train_retrieval.py` adds them; FLAVA: its contrastive embeddings), checked against rankings
computed here with transformers' own `BlipForImageTextRetrieval` and `FlavaForPreTraining`
calls; and the cache of the cross-encoders' scores (a second round with the same inputs loads and
scores nothing). ViLT re-ranking a CLIP's top k is tested in test_eccv_positives_mitl.py, and
here re-ranking a contrastive head's (FlavaModel's), as `counterfactory benchmark` allows."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from builders.app.cli import main as cli_main
from builders.engine.provenance import model_name
from helpers.eccv_mitl_fixtures import round_args

ROUND = round_args(2, 2, 3)


def _candidates(gallery, tmp_path, *args: str, out: str = "c.json") -> dict:
    argv = ["eccv", "candidates", "--coco-root", str(gallery["root"]), *ROUND, *args]
    assert cli_main([*argv, "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / out)]) == 0
    return json.loads((tmp_path / out).read_text())


def _check_ranking(data: dict, name: str, gallery, scores) -> None:
    """Each query's proposals by `name` are the top 5 of `scores(modality, query)` (over the
    whole gallery side, -inf outside what the annotator ranks), ties to the lower gallery index:
    the score at every rank equal (1e-5 relative), so near-ties of a tiny random model may swap."""
    got: dict[tuple, dict[int, int]] = {}
    for c in data["candidates"]:
        got.setdefault((c["modality"], c["query_id"]), {})[c["proposed_by"][name]] = c["item_id"]
    checked = 0
    for modality in ("i2t", "t2i"):
        items = gallery["caption_ids"] if modality == "i2t" else gallery["image_ids"]
        for q in data["queries"][modality]:
            s = scores(modality, q)
            expected = [items[j] for j in np.lexsort((np.arange(len(items)), -s))[:5]]
            mine = [got[(modality, q)][r] for r in sorted(got[(modality, q)])]
            score = dict(zip(items, s, strict=True))
            assert len(mine) == 5 and np.isfinite([score[m] for m in mine]).all(), (q, mine)
            ranked = np.isfinite(s)  # scores far enough apart for a wrong ranking to show
            assert ranked.sum() >= 25 and np.ptp(s[ranked]) > 1e-2, np.ptp(s[ranked])
            assert np.allclose([score[m] for m in mine], [score[e] for e in expected], rtol=1e-5, atol=1e-5)
            assert len(data["exclude"][modality][str(q)]) == 25
            checked += 1
    assert checked == 4


def _pairs(gallery, modality: str, q: int) -> tuple[list, list[str]]:
    """The query against every item of the other side: (images, captions), one pair an item."""
    images = [Image.open(p).convert("RGB") for p in gallery["paths"]]
    if modality == "i2t":
        return [images[gallery["image_ids"].index(q)]] * len(gallery["texts"]), gallery["texts"]
    return images, [gallery["texts"][gallery["caption_ids"].index(q)]] * len(images)


def test_a_blip_annotator_proposes_its_itc_top_k_reranked_by_itm_plus_itc(gallery, spread, tmp_path):
    from transformers import AutoProcessor, BlipForImageTextRetrieval

    blip, k = str(spread["blip"]), 30
    data = _candidates(gallery, tmp_path, "--model", blip, "--rerank-k", str(k))
    name = model_name(blip)
    assert data["config"]["rerankers"][name] == {
        "architecture": "BlipForImageTextRetrieval",
        "method": "itc_top_k_reranked_by_itm_plus_itc",
        "k": k,
        "first_stage": None,
        "g": "blip_itm_logit",
    }
    model, proc = BlipForImageTextRetrieval.from_pretrained(blip).eval(), AutoProcessor.from_pretrained(blip)

    def scores(modality: str, q: int) -> np.ndarray:
        images, texts = _pairs(gallery, modality, q)
        with torch.no_grad():
            x = proc(images=images, text=texts, return_tensors="pt", padding=True, truncation=True)
            itc = model(**x, use_itm_head=False).itm_score.diagonal().numpy()  # pair n: image n, text n
            top = np.lexsort((np.arange(len(itc)), -itc))[:k]  # BLIP's ITC top k
            itm = model(**x, use_itm_head=True).itm_score[:, 1].numpy()
        out = np.full(len(itc), -np.inf)
        out[top] = itm[top] + itc[top]  # train_retrieval.py: itm_head(...)[:, 1] + topk_sim
        return out

    _check_ranking(data, name, gallery, scores)


@pytest.mark.parametrize("family, head", [("flava", "FlavaForPreTraining"), ("flava-itc", "FlavaModel")])
def test_a_flava_annotator_proposes_its_contrastive_ranking(family, head, gallery, spread, tmp_path):
    """`flava-itc`, a FlavaModel, is loaded here as FlavaForPreTraining (its weights are its `flava`)."""
    from transformers import AutoProcessor, FlavaForPreTraining

    flava = str(spread[family])
    data = _candidates(gallery, tmp_path, "--model", flava)
    name = model_name(flava)
    assert data["config"]["rerankers"][name] == {
        "architecture": head,
        "method": "contrastive",
        "k": 0,
        "first_stage": None,
        "g": None,
    }
    model, proc = FlavaForPreTraining.from_pretrained(flava).eval(), AutoProcessor.from_pretrained(flava)

    def scores(modality: str, q: int) -> np.ndarray:
        images, texts = _pairs(gallery, modality, q)
        with torch.no_grad():
            x = proc(images=images, text=texts, return_tensors="pt", padding=True, truncation=True)
            out = model(**x, input_ids_masked=x["input_ids"], return_loss=False)
            # The logit scale times the cosine of pair n's image and text: the same ranking.
            return (out.contrastive_logits_per_image.diagonal() / model.flava.logit_scale.exp()).numpy()

    _check_ranking(data, name, gallery, scores)


def test_a_vilt_annotator_reranks_the_top_k_of_a_contrastive_head_first_stage(gallery, spread, tmp_path):
    """--first-stage may be any model with embeddings, as for the benchmark (the rule of
    builders/models/cross_ranking.py): here FLAVA's contrastive model (FlavaModel), whose top
    --rerank-k by its own contrastive logits ViLT re-ranks by its ITM logit (`logits[:, 0]`)."""
    from transformers import AutoProcessor, FlavaForPreTraining, ViltForImageAndTextRetrieval

    vilt, flava, k = str(spread["vilt"]), str(spread["flava-itc"]), 30
    data = _candidates(gallery, tmp_path, "--model", vilt, "--first-stage", flava, "--rerank-k", str(k))
    name = model_name(vilt)
    assert data["config"]["rerankers"][name] == {
        "architecture": "ViltForImageAndTextRetrieval",
        "method": "first_stage_top_k_reranked_by_itm",
        "k": k,
        "first_stage": model_name(flava),
        "g": "vilt_itm_logit",
    }
    first, first_proc = FlavaForPreTraining.from_pretrained(flava).eval(), AutoProcessor.from_pretrained(flava)
    model, proc = ViltForImageAndTextRetrieval.from_pretrained(vilt).eval(), AutoProcessor.from_pretrained(vilt)

    def scores(modality: str, q: int) -> np.ndarray:
        images, texts = _pairs(gallery, modality, q)
        with torch.no_grad():
            x = first_proc(images=images, text=texts, return_tensors="pt", padding=True, truncation=True)
            itc = first(**x, input_ids_masked=x["input_ids"], return_loss=False).contrastive_logits_per_image
            top = np.lexsort((np.arange(len(texts)), -itc.diagonal().numpy()))[:k]  # FLAVA's top k
            x = proc(images=images, text=texts, return_tensors="pt", padding=True, truncation=True)
            g = model(**x).logits[:, 0].numpy()
        out = np.full(len(texts), -np.inf)
        out[top] = g[top]
        return out

    _check_ranking(data, name, gallery, scores)


def test_a_first_stage_without_embeddings_is_refused_in_one_line(tiny_families_dir, tmp_path, capsys):
    """ViLT has no embeddings to pick candidates with: one line, exit 2, before the (missing)
    gallery is read, as the benchmark refuses it."""
    vilt = str(tiny_families_dir / "vilt")
    argv = ["eccv", "candidates", "--coco-root", str(tmp_path / "no-coco"), "--model", vilt, "--first-stage", vilt]
    assert cli_main([*argv, "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "--first-stage" in err and "ViLT" in err and "without embeddings" in err and "no-coco" not in err, err
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("family", ["vilt", "blip"])
def test_a_second_round_scores_no_pair_again(
    family, gallery, annotators, tiny_families_dir, tmp_path, monkeypatch, caplog
):
    """The cross-encoder's re-ranked scores are cached under the model, gallery, queries, method,
    k and first stage: the same round again loads no model (so no forward call) and proposes the
    same; another k is another entry; a damaged entry is a warning and scored again."""
    from builders.models import cross_encoders

    loads = []
    real = cross_encoders.load_cross_encoder
    monkeypatch.setattr(cross_encoders, "load_cross_encoder", lambda *a, **kw: loads.append(a) or real(*a, **kw))
    args = ["--model", str(tiny_families_dir / family), "--rerank-k", "30"]
    args += ["--first-stage", annotators[0]] if family == "vilt" else []
    first = _candidates(gallery, tmp_path, *args, out="first.json")
    assert len(loads) == (1 if family == "vilt" else 2)  # BLIP: its ITC embeddings, then its ITM
    loads.clear()
    again = _candidates(gallery, tmp_path, *args, out="again.json")
    assert loads == []
    assert again["candidates"] == first["candidates"] and again["exclude"] == first["exclude"]
    folder = tmp_path / "cache" / "cross_encoder_scores"
    assert sorted(p.suffix for p in folder.iterdir()) == [".json", ".npz"]
    (npz,) = folder.glob("*.npz")
    npz.write_bytes(npz.read_bytes()[:100])  # truncated
    assert _candidates(gallery, tmp_path, *args, out="damaged.json")["candidates"] == first["candidates"]
    assert len(loads) == 1 and any(
        npz.name in r.getMessage() and "scoring it again" in r.getMessage() for r in caplog.records
    )
    loads.clear()
    _candidates(gallery, tmp_path, *args, "--rerank-k", "40", out="other_k.json")
    assert len(loads) == 1  # the embeddings are cached; the pairs of another k are scored
    assert len(list(folder.glob("*.json"))) == 2
