"""The tiny model profile: every role builds offline and loads through the same loaders as the
production ids; profiles and overrides resolve as documented."""

from __future__ import annotations

import argparse
import hashlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import pipeline

from builders.app.cli import main as cli_main
from builders.engine.errors import UserFacingError
from builders.models import loaders
from builders.models.clip_ids import parse_clip_id
from builders.models.profiles import (
    PRODUCTION,
    ROLES,
    add_model_arguments,
    profile_from_args,
    resolve_profile,
    with_overrides,
)
from builders.models.tiny import DONE, build_tiny_models
from builders.models.tiny import ROLES as TINY_ROLES  # the roles the builder makes (no sentence)
from builders.engine.nltk_setup import read_tagged_corpus


@pytest.fixture(scope="module")
def tiny(tiny_models_dir):
    return resolve_profile("tiny", tiny_models_dir)


def test_clip_roles_score_image_text_pairs(tiny):
    model, processor = loaders.load_clip(tiny.clip)
    batch = processor(
        text=["a cat", "two dogs on the grass"],
        images=[Image.new("RGB", (128, 96))] * 3,
        return_tensors="pt",
        padding=True,
    )
    with torch.no_grad():
        assert model(**batch).logits_per_image.shape == (3, 2)
    oc, preprocess, tokenizer = loaders.load_open_clip(parse_clip_id(tiny.open_clip, "open_clip"))
    with torch.no_grad():
        img = oc.encode_image(preprocess(Image.new("RGB", (128, 96))).unsqueeze(0))
        txt = oc.encode_text(tokenizer(["a cat", "a dog"]))
    assert img.shape[1] == txt.shape[1] and txt.shape[0] == 2


@pytest.mark.slow
def test_diffusion_pipelines_run_two_steps(tiny):
    pipe = loaders.load_sd(tiny.sd)
    out = pipe(
        "a cat",
        num_inference_steps=2,
        height=64,
        width=64,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    ).images
    again = pipe(
        "a cat",
        num_inference_steps=2,
        height=64,
        width=64,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    ).images
    assert out.shape == (1, 64, 64, 3) and np.array_equal(out, again)
    inpaint = loaders.load_sd(tiny.sd_inpaint, inpaint=True)
    img = inpaint(
        "background",
        image=Image.new("RGB", (64, 64), (200, 10, 10)),
        mask_image=Image.new("L", (64, 64), 255),
        num_inference_steps=2,
        height=64,
        width=64,
        output_type="np",
    ).images
    assert img.shape == (1, 64, 64, 3) and np.isfinite(img).all()


def test_text_models(tiny):
    mlm, tok = loaders.load_mlm(tiny.mlm)
    # The noun-swap step asks a fill-mask pipeline for words; the tiny MLM must propose whole
    # caption words (as roberta-base does), not word pieces or bytes.
    corpus_words = {w for sentence in read_tagged_corpus() for w, _ in sentence}
    fill = pipeline("fill-mask", model=mlm, tokenizer=tok, top_k=10)
    for text in ("A dog on the <mask> .", "Two <mask> sitting on a bench ."):
        proposals = [p["token_str"] for p in fill(text)]
        assert len(proposals) == 10
        assert all(p.startswith(" ") and p.strip() in corpus_words for p in proposals), proposals
    # Caption words are single tokens, as with roberta-base.
    assert len(tok("A dog riding a skateboard .").input_ids) == 2 + 6
    lm, ltok = loaders.load_lm(tiny.lm)
    ids = ltok("A dog on the grass .", return_tensors="pt").input_ids
    with torch.no_grad():
        ppl = torch.exp(lm(ids, labels=ids).loss)
    assert torch.isfinite(ppl) and ppl > 1
    cap, proc = loaders.load_captioner(tiny.captioner)
    out = cap.generate(**proc(images=Image.new("RGB", (64, 48)), return_tensors="pt"), max_new_tokens=5)
    assert isinstance(proc.batch_decode(out, skip_special_tokens=True)[0], str)
    sentence = loaders.load_sentence(tiny.sentence)
    emb = sentence.encode(["A dog on the grass.", "A puppy on the lawn.", "A red bus."], normalize_embeddings=True)
    assert emb.shape == (3, 384)
    assert emb[0] @ emb[1] > emb[0] @ emb[2]  # the real MiniLM, not a random one


def test_build_is_idempotent_deterministic_and_safe_in_parallel(tiny_models_dir, tmp_path, capsys):
    marker = tiny_models_dir / DONE
    mtime = marker.stat().st_mtime_ns
    build_tiny_models(tiny_models_dir)
    assert marker.stat().st_mtime_ns == mtime
    # Two builders of one folder at once (as two `accelerate launch` ranks would): the CLI and a
    # thread. Both must succeed, and since they share torch's global RNG, interleaved builds
    # would also break the byte-for-byte equality checked below.
    again = tmp_path / "again"
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(build_tiny_models, again)
        assert cli_main(["models", "tiny", str(again)]) == 0
        assert other.result() == {role: again / role for role in TINY_ROLES}  # re-raises its error
    assert str(again / "mlm") in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "again.lock"]  # no temp folders
    for role in ("clip", "sd/unet", "sd_inpaint/unet", "mlm", "lm", "captioner"):
        weights = next((tiny_models_dir / role).glob("*.safetensors")).name
        a = hashlib.sha256((tiny_models_dir / role / weights).read_bytes()).digest()
        b = hashlib.sha256((again / role / weights).read_bytes()).digest()
        assert a == b, role


def test_profiles_and_overrides(tiny_models_dir, capsys):
    assert resolve_profile("production") == PRODUCTION
    assert PRODUCTION.mlm.endswith("roberta-base") and PRODUCTION.lm.endswith("gpt2-large")
    with pytest.raises(UserFacingError, match="unknown model profile 'huge'"):
        resolve_profile("huge")
    assert with_overrides(PRODUCTION, mlm="my/mlm", lm=None).mlm == "my/mlm"
    with pytest.raises(UserFacingError, match="unknown model role"):
        with_overrides(PRODUCTION, vae="x")
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    args = parser.parse_args(
        ["--models", "tiny", "--tiny-models-dir", str(tiny_models_dir), "--sd-model", "/elsewhere/sd"]
    )
    profile = profile_from_args(args)
    assert profile.sd == "/elsewhere/sd" and profile.mlm == str(tiny_models_dir / "mlm")
    assert cli_main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert all(role in out for role in ROLES)


def test_unloadable_model_is_a_clear_error(tmp_path):
    with pytest.raises(UserFacingError, match="cannot load the masked LM model .*--models tiny"):
        loaders.load_mlm(str(tmp_path / "nothing-here"))


def test_tiny_captioner_tokenizes_caption_words(tiny):
    """The captioning path's tokenizer, loaded as the loader loads it from the folder `counterfactory
    models tiny` writes: a caption's words are its vocabulary's ids, not [UNK] (transformers 5's
    BertTokenizer read no vocab_file given to its constructor, so every word was [UNK])."""
    _, processor = loaders.load_captioner(tiny.captioner)
    tok = processor.tokenizer
    caption = "a dog on a couch"
    ids = tok(caption, add_special_tokens=False)["input_ids"]
    assert len(ids) == 5 and tok.unk_token_id not in ids
    assert tok.convert_ids_to_tokens(ids) == caption.split()
