"""Counterfactual captions (builders/counterfactuals/METHOD.md §1): swap one noun so the caption describes a different scene.

Per caption, as the published generator does it (`counter_caption_generation_perplexity.py` of
COCO-Counterfactuals):

1. NLTK tokens and tags; candidate positions are the tokens tagged NN or NNS.
2. Each position is replaced by the MLM mask token, the tokens are joined with spaces and the
   MLM's top-k (10) fill-mask proposals become candidate sentences (the fill-mask pipeline's
   `sequence`: the filled token ids decoded without special tokens).
3. A candidate is kept when it has as many NLTK tokens as the original and its token at the
   masked position is tagged NN, NNS or NNP. Candidates of all positions are pooled.
4. Sentence similarity to the original caption (cosine); keep `low < s <= high` (0.8, 0.91].
5. Perplexity `exp(mean token NLL)` without a BOS token; the lowest wins (first one on ties).

What differs from the reference, on purpose:
- The published counterfactual is the original string with exactly the swapped word's character
  span replaced (`edit_at`): the decoded fill-mask sequence only supplies the new word. Decoding
  re-joins tokens, and byte-level BPE tokenizers (RoBERTa) under transformers 5 no longer clean
  up spaces, which gave `"through the  truck ."`: a formatting cue a model could learn instead
  of the content. The length/tag check of step 3 runs on that final string, and so do the
  similarity and the perplexity.
- Batching (the reference scores one candidate at a time): one MLM forward for every masked
  position of a batch of captions, one sentence-model encode for every candidate of the batch,
  one padded LM forward for every survivor (chunked only to bound memory).
- Order (`order`): the choice is "lowest perplexity among the candidates in the window", which
  can also be found perplexity first (score all, then check similarities in ascending
  perplexity until one is in the window). That is cheaper when the LM is smaller than the
  sentence model (tiny test models); `auto` picks by parameter count.
- A candidate whose replacement equals the original word (ignoring case) is dropped (as the published generator does), and
  duplicates are pooled once (same sentence, same scores: the choice cannot change).
- Captions the reference would crash on or silently drop are dropped with a counted reason:
  `too_short` (< `min_words` words: one token has no perplexity), `not_english` (see
  `looks_english`), `too_long` (more tokens than the MLM or LM accepts), `no_token_spans`
  (NLTK's tokens cannot be located in the string), `no_nouns`,
  `no_valid_substitution`, `no_candidate_in_similarity_window`, `no_scorable_candidate`.
- Tokenisation uses `word_tokenize(text, preserve_line=True)` (no `punkt` data needed), which
  leaves a period inside a caption on its word ("rides a bike. He is" -> `bike.`). The
  reference's default splits sentences first, which separates it; `caption_tokens` splits such a
  period off the same way, so a two-sentence caption's noun is a word and its edit keeps the
  period (editing `bike.` whole would drop it: "rides a meat He is").
- Options from the paper's future work: `avoid_related_nouns` drops substitutions where one noun
  is a WordNet hyponym, hypernym or synonym of the other (girl -> kid), and every row says whether
  the swap touches the "human" taxonomy (`HUMAN_WORDS`, 44% error rate in the paper's study).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch

from builders.counterfactuals.caption_text import caption_tokens, count_words, edit_at, looks_english, token_spans
from builders.counterfactuals.config import CaptionStageConfig
from builders.engine.batching import ShrinkingBatches
from builders.engine.errors import UserFacingError
from counterfactory_metrics.odmap.noun_phrases import default_tagger

log = logging.getLogger(__name__)

HUMAN_WORDS = frozenset(
    {
        "girl",
        "girls",
        "boy",
        "boys",
        "man",
        "men",
        "woman",
        "women",
        "guy",
        "guys",
        "kid",
        "kids",
        "person",
        "persons",
        "people",
        "child",
        "children",
        "couple",
        "couples",
        "group",
        "groups",
        "lady",
        "ladies",
    }
)
REASONS = (
    "contains_mask_token",
    "too_short",
    "not_english",
    "too_long",
    "no_token_spans",
    "no_nouns",
    "no_valid_substitution",
    "no_candidate_in_similarity_window",
    "no_scorable_candidate",
)


@dataclass(frozen=True)
class CounterfactualCaption:
    original: str
    #: `original` with the characters `[start, start + len(replaced))` replaced by `replacement`.
    counterfactual: str
    #: Index of the replaced token in the NLTK tokens of the original caption.
    position: int
    #: Character offset of the swapped word, the same in both captions.
    start: int
    replaced: str
    replacement: str
    similarity: float
    perplexity: float
    #: Pooled candidates after the length/tag filter, and how many were in the similarity
    #: window (None in the perplexity-first order, which stops at the first one).
    candidates: int
    in_window: int | None
    human_substitution: bool


@dataclass
class CaptionModels:
    """The three models of the stage (load with `CaptionModels.load`)."""

    mlm: Any
    mlm_tokenizer: Any
    lm: Any
    lm_tokenizer: Any
    sentence: Any

    @classmethod
    def load(cls, mlm_id: str, lm_id: str, sentence_id: str, device: str = "cpu") -> CaptionModels:
        from builders.models.loaders import load_lm, load_mlm, load_sentence

        mlm, mlm_tok = load_mlm(mlm_id, device)
        lm, lm_tok = load_lm(lm_id, device)
        return cls(mlm, mlm_tok, lm, lm_tok, load_sentence(sentence_id, device))

    def mlm_limit(self) -> int:
        # RoBERTa-style position ids start after the padding index, so 2 positions are unusable;
        # counting them for every model is conservative by 2 tokens for BERT-style ones.
        return min(self.mlm_tokenizer.model_max_length, self.mlm.config.max_position_embeddings - 2)

    def lm_limit(self) -> int:
        cfg = self.lm.config
        return min(
            self.lm_tokenizer.model_max_length, getattr(cfg, "n_positions", None) or cfg.max_position_embeddings
        )


def lm_perplexities(lm, tok, sentences: Sequence[str], batch: int, limit: int) -> list[float]:
    """`exp(mean token NLL)` per sentence (no BOS) under the causal LM `lm`, from padded batches
    of `batch`; NaN when a sentence has fewer than 2 LM tokens or more than `limit` (it cannot
    be scored). The caption stage's perplexity filter, and the model report's blind baseline."""
    encoded = [tok(s).input_ids for s in sentences]
    out = [math.nan] * len(sentences)
    todo = [k for k, ids in enumerate(encoded) if 2 <= len(ids) <= limit]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    for start in range(0, len(todo), max(1, batch)):
        chunk = todo[start : start + max(1, batch)]
        width = max(len(encoded[k]) for k in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, k in enumerate(chunk):  # right padding: real tokens keep positions 0..n-1
            ids[row, : len(encoded[k])] = torch.tensor(encoded[k])
            mask[row, : len(encoded[k])] = 1
        with torch.inference_mode():
            ids, mask = ids.to(lm.device), mask.to(lm.device)
            logits = lm(input_ids=ids, attention_mask=mask).logits.float()
        nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
        target = mask[:, 1:].float()
        mean = (nll * target).sum(1) / target.sum(1)
        for row, k in enumerate(chunk):
            out[k] = math.exp(mean[row].item())
    return out


class NounRelations(Protocol):
    def related(self, word: str, other: str) -> bool:
        """True when one noun is a hyponym, hypernym or synonym of the other."""


class WordNetRelations:
    """Noun taxonomy relations from WordNet (NLTK `wordnet` data)."""

    def __init__(self) -> None:
        from nltk.corpus import wordnet

        try:
            wordnet.ensure_loaded()
        except LookupError:
            raise UserFacingError(
                "the related-noun filter needs NLTK's WordNet data; download it once with "
                "`python -m nltk.downloader wordnet` (or drop --avoid-related-nouns)"
            ) from None
        self.wn = wordnet

    def _synsets(self, word: str):
        lemma = self.wn.morphy(word.lower(), self.wn.NOUN) or word.lower()
        return set(self.wn.synsets(lemma, pos=self.wn.NOUN))

    def related(self, word: str, other: str) -> bool:
        a, b = self._synsets(word), self._synsets(other)
        if a & b:
            return True
        up = lambda s: s.hypernyms() + s.instance_hypernyms()  # noqa: E731
        return any(b & set(s.closure(up)) for s in a) or any(a & set(s.closure(up)) for s in b)


@dataclass
class _Caption:
    """Working state of one caption through the stage."""

    text: str
    tokens: list[str]
    spans: list[tuple[int, int]]
    positions: list[int]
    #: (sentence, position) in pooled order.
    pool: list[tuple[str, int]]
    #: Pool indices whose perplexity is undefined (perplexity-first order only).
    unscorable: list[int] = field(default_factory=list)


class CaptionStage:
    """Batched counterfactual-caption generation. `run(captions)` -> one outcome per caption:
    a `CounterfactualCaption` or the reason (a string from `REASONS`) it produced none."""

    def __init__(
        self, models: CaptionModels, config: CaptionStageConfig, relations: NounRelations | None = None
    ) -> None:
        self.models, self.config = models, config
        self.tagger = default_tagger()
        self.relations = relations
        if config.avoid_related_nouns and relations is None:
            self.relations = WordNetRelations()
        self._tag_cache: dict[str, tuple[list[str], list[str]]] = {}
        self.order = self._resolve_order()
        # Halved and retried on out-of-memory; a caption's outcome does not depend on its batch.
        self.batches = ShrinkingBatches(
            "caption stage", config.caption_batch, hint="try --dtype fp16 or a GPU with more memory"
        )
        log.info("caption stage: scoring %s (order=%s)", self.order.replace("_", " "), config.order)

    def _resolve_order(self) -> str:
        order = self.config.order
        if order not in ("auto", "similarity_first", "perplexity_first"):
            raise UserFacingError(f"unknown caption scoring order {order!r}")
        if order != "auto":
            return order
        size = lambda model: sum(p.numel() for p in model.parameters())  # noqa: E731
        smaller_lm = size(self.models.lm) < size(self.models.sentence)
        return "perplexity_first" if smaller_lm else "similarity_first"

    def _tag(self, text: str) -> tuple[list[str], list[str]]:
        # Tagging is the stage's Python hot spot; the chosen candidate is tagged twice.
        hit = self._tag_cache.get(text)
        if hit is None:
            tokens = caption_tokens(text)
            hit = (tokens, [t for _, t in self.tagger.tag(tokens)]) if tokens else ([], [])
            if len(self._tag_cache) > 100_000:
                self._tag_cache.clear()
            self._tag_cache[text] = hit
        return hit

    def run(self, captions: Sequence[str]) -> list[CounterfactualCaption | str]:
        return self.batches.map(list(captions), self._run_batch)

    # -- steps -------------------------------------------------------------------------------

    def _prepare(self, text: str) -> _Caption | str:
        if self.models.mlm_tokenizer.mask_token in text:
            return "contains_mask_token"
        tokens, tags = self._tag(text)
        if self.config.english_check and not looks_english(tokens):
            return "not_english"
        if count_words(tokens) < self.config.min_words:
            return "too_short"
        mlm_len = len(self.models.mlm_tokenizer(text).input_ids)
        lm_len = len(self.models.lm_tokenizer(text).input_ids)
        if mlm_len > self.models.mlm_limit() or lm_len > self.models.lm_limit():
            return "too_long"
        spans = token_spans(text, tokens)
        if spans is None:
            return "no_token_spans"
        # A noun whose span is not its token verbatim cannot be edited in place (never seen for
        # a word: NLTK rewrites quotes only).
        positions = [
            i for i, tag in enumerate(tags) if tag in self.config.noun_tags and text[slice(*spans[i])] == tokens[i]
        ]
        if not positions:
            return "no_nouns"
        return _Caption(text, tokens, spans, positions, [])

    def _propose(self, captions: list[_Caption]) -> None:
        """One MLM forward for every masked position of the batch; fills each caption's pool."""
        tok = self.models.mlm_tokenizer
        jobs = [(c, i) for c in captions for i in c.positions]
        if not jobs:
            return
        texts = [" ".join(tok.mask_token if k == i else t for k, t in enumerate(c.tokens)) for c, i in jobs]
        enc = tok(texts, return_tensors="pt", padding=True).to(self.models.mlm.device)
        mask_rows, mask_cols = torch.nonzero(enc.input_ids == tok.mask_token_id, as_tuple=True)
        if len(mask_rows) != len(jobs) or not torch.equal(mask_rows.cpu(), torch.arange(len(jobs))):
            raise RuntimeError("expected exactly one mask token per masked caption")
        with torch.inference_mode():
            probs = self._mask_logits(enc, mask_rows, mask_cols).float().softmax(dim=-1)
        top = probs.topk(self.config.top_k).indices.tolist()
        input_ids, keep = enc.input_ids.cpu(), enc.attention_mask.cpu().bool()
        for row, ((cap, i), proposals) in enumerate(zip(jobs, top, strict=True)):
            ids = input_ids[row].clone()
            seen = {s for s, _ in cap.pool}
            for token_id in proposals:
                ids[mask_cols[row]] = token_id
                # The fill-mask pipeline's `sequence`, which only supplies the new word.
                decoded = tok.decode(ids[keep[row]], skip_special_tokens=True)
                sentence = self._edit(cap, decoded, i)
                if sentence is not None and sentence not in seen:
                    seen.add(sentence)
                    cap.pool.append((sentence, i))

    def _mask_logits(self, enc, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """MLM logits at the mask positions only: the vocabulary projection of every position
        of a large batch would cost GBs (roberta: 50k logits per token)."""
        model = self.models.mlm
        base = getattr(model, model.base_model_prefix, None)
        head = getattr(model, "lm_head", None) or getattr(model, "cls", None)  # RoBERTa / BERT
        if base is None or head is None:
            return model(**enc).logits[rows, cols]
        return head(base(**enc).last_hidden_state[rows, cols])

    def _edit(self, cap: _Caption, decoded: str, i: int) -> str | None:
        """The candidate: the original with token i's span replaced by the decoded sequence's
        token i, if both have the original's token count and the edited string tags the new
        word as a noun; None otherwise."""
        proposed = self._tag(decoded)[0]
        if len(proposed) != len(cap.tokens):
            return None
        word = proposed[i]
        if word.lower() == cap.tokens[i].lower():
            return None
        sentence = edit_at(cap.text, cap.spans[i], word)
        tokens, tags = self._tag(sentence)
        if len(tokens) != len(cap.tokens) or tokens[i] != word or tags[i] not in self.config.replacement_tags:
            return None
        if self.relations is not None and self.relations.related(cap.tokens[i], word):
            return None
        return sentence

    def _encode(self, texts: Sequence[str]) -> torch.Tensor:
        """Normalised sentence embeddings of `texts`, in one encode call."""
        emb = self.models.sentence.encode(
            list(texts), batch_size=self.config.encode_batch, convert_to_tensor=True, show_progress_bar=False
        )
        return torch.nn.functional.normalize(emb.float(), dim=-1)

    def _in_window(self, sim: float) -> bool:
        return self.config.sim_low < sim <= self.config.sim_high

    def perplexities(self, sentences: Sequence[str]) -> list[float]:
        """`lm_perplexities` of the stage's LM."""
        return lm_perplexities(
            self.models.lm, self.models.lm_tokenizer, sentences, self.config.lm_batch, self.models.lm_limit()
        )

    def _run_batch(self, texts: Sequence[str]) -> list[CounterfactualCaption | str]:
        prepared = [self._prepare(t) for t in texts]
        live = [c for c in prepared if isinstance(c, _Caption)]
        self._propose(live)
        with_pool = [c for c in live if c.pool]
        if self.order == "similarity_first":
            chosen = self._similarity_first(with_pool)
        else:
            chosen = self._perplexity_first(with_pool)
        return [cap if isinstance(cap, str) else chosen.get(id(cap), "no_valid_substitution") for cap in prepared]

    def _similarity_first(self, caps: list[_Caption]) -> dict[int, CounterfactualCaption | str]:
        """The reference's order: similarity of every candidate, perplexity of those in the
        window (one encode call, one padded LM pass for the whole batch)."""
        if not caps:
            return {}
        emb = self._encode([c.text for c in caps] + [s for c in caps for s, _ in c.pool])
        window, offset = {}, len(caps)
        for k, cap in enumerate(caps):
            sims = (emb[offset : offset + len(cap.pool)] @ emb[k]).tolist()
            offset += len(cap.pool)
            window[id(cap)] = [(s, i, sim) for (s, i), sim in zip(cap.pool, sims, strict=True) if self._in_window(sim)]
        ppl = iter(self.perplexities([s for cap in caps for s, _, _ in window[id(cap)]]))
        out: dict[int, CounterfactualCaption | str] = {}
        for cap in caps:
            scored = [(next(ppl), s, i, sim) for s, i, sim in window[id(cap)]]
            best = None
            for entry in scored:  # strict `<`: the first lowest wins, as in the reference
                if not math.isnan(entry[0]) and (best is None or entry[0] < best[0]):
                    best = entry
            if best is None:
                out[id(cap)] = "no_scorable_candidate" if scored else "no_candidate_in_similarity_window"
            else:
                out[id(cap)] = self._choose(cap, *best, in_window=len(scored))
        return out

    def _perplexity_first(self, caps: list[_Caption]) -> dict[int, CounterfactualCaption | str]:
        """Same choice, other order: perplexity of every candidate, then similarities in
        ascending perplexity (`probe` candidates per caption per encode call) until one is in
        the window; that one is the lowest-perplexity candidate in the window. Cheaper when the
        LM is smaller than the sentence model (the tiny profile)."""
        if not caps:
            return {}
        flat = self.perplexities([s for c in caps for s, _ in c.pool])
        ranked: dict[int, list[tuple[float, int]]] = {}
        offset = 0
        for cap in caps:
            ppl = flat[offset : offset + len(cap.pool)]
            offset += len(cap.pool)
            # (perplexity, pool index): ties go to the earlier candidate, as in the reference.
            ranked[id(cap)] = sorted((p, k) for k, p in enumerate(ppl) if not math.isnan(p))
            cap.unscorable = [k for k, p in enumerate(ppl) if math.isnan(p)]
        originals = dict(zip(map(id, caps), self._encode([c.text for c in caps]), strict=True))
        out: dict[int, CounterfactualCaption | str] = {}
        pending, start, probe = list(caps), 0, max(1, self.config.probe)
        while pending:
            chunks = {id(c): ranked[id(c)][start : start + probe] for c in pending}
            emb = iter(self._encode([c.pool[k][0] for c in pending for _, k in chunks[id(c)]]))
            for cap in pending:
                for p, k in chunks[id(cap)]:
                    sim = float(next(emb) @ originals[id(cap)])
                    if id(cap) not in out and self._in_window(sim):
                        out[id(cap)] = self._choose(cap, p, cap.pool[k][0], cap.pool[k][1], sim, None)
            start += probe
            pending = [c for c in pending if id(c) not in out and start < len(ranked[id(c)])]
        for cap in caps:
            if id(cap) not in out:
                sims = (
                    self._encode([cap.pool[k][0] for k in cap.unscorable]) @ originals[id(cap)]
                    if cap.unscorable
                    else torch.empty(0)
                ).tolist()
                out[id(cap)] = (
                    "no_scorable_candidate" if any(map(self._in_window, sims)) else "no_candidate_in_similarity_window"
                )
        return out

    def _choose(
        self, cap: _Caption, ppl: float, sentence: str, i: int, sim: float, in_window: int | None
    ) -> CounterfactualCaption:
        replacement = self._tag(sentence)[0][i]
        human = cap.tokens[i].lower() in HUMAN_WORDS or replacement.lower() in HUMAN_WORDS
        return CounterfactualCaption(
            original=cap.text,
            counterfactual=sentence,
            position=i,
            start=cap.spans[i][0],
            replaced=cap.tokens[i],
            replacement=replacement,
            similarity=sim,
            perplexity=ppl,
            candidates=len(cap.pool),
            in_window=in_window,
            human_substitution=human,
        )
