"""What a COCO-Counterfactuals build makes: the stages, model roles, and the settings of the two
stages (builders/counterfactuals/METHOD.md §1, §2) under `CocoCounterfactualsConfig`.

Plain dataclasses with no heavy import: the command line (`builders.counterfactuals.options`)
reads their defaults to build `--help` without loading torch or NLTK.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from builders.counterfactuals.generators import GENERATOR_NAMES
from builders.engine.errors import UserFacingError
from loading_scripts.images import DEFAULT_MAX_IMAGE_PIXELS

#: What `--stage` builds: caption pairs, image pairs of an earlier captions build, or both.
STAGES = ("captions", "images", "all")
#: Model roles, one `--<role>-model` flag each.
MODEL_ROLES = ("mlm", "lm", "sentence", "sd", "clip_filter")
#: The models of each stage (the rest of `MODEL_ROLES` is unused by that stage).
CAPTION_ROLES, IMAGE_ROLES = ("mlm", "lm", "sentence"), ("sd", "clip_filter")
#: Image-pair filters, in the order they are reported: caption-image CLIP of both images,
#: image-image CLIP, CLIP directional similarity (App. B.1.2 of the paper applies all three).
IMAGE_FILTERS = ("text_image", "image_image", "directional")
#: How candidate specs are drawn (builders/counterfactuals/METHOD.md §2): `independent`, the
#: paper's sampling (a seed, p and guidance per candidate); `grouped`, `seeds` x `p_values`
#: candidates that share their seed and guidance per group (what shared computation saves on).
CANDIDATE_PLANS = ("independent", "grouped")
#: The paper's caption source (Le et al. 2023 §3.3, fn. 9): COCO val2017's 25,014 captions.
DEFAULT_COCO_SPLITS = ("val2017",)
#: How `--images-from` names a row's two images (`builders.counterfactuals.image_sources`):
#: `auto` detects one of the others from the files.
IMAGE_LAYOUTS = ("auto", "folders", "numbered", "release")


@dataclass
class CaptionStageConfig:
    """Example: `CaptionStageConfig(sim_low=0.5, sim_high=0.99)` for a permissive window."""

    #: MLM proposals per noun position (paper: 10).
    top_k: int = 10
    #: Keep candidates with `sim_low < similarity <= sim_high` (paper: 0.8, 0.91).
    sim_low: float = 0.8
    sim_high: float = 0.91
    #: Tags of the positions to replace, and tags the replacement must have (reference values).
    noun_tags: tuple[str, ...] = ("NN", "NNS")
    replacement_tags: tuple[str, ...] = ("NN", "NNS", "NNP")
    #: Captions with fewer words (tokens holding a letter) are dropped as `too_short`.
    min_words: int = 2
    #: Drop captions that do not look English (`looks_english`) as `not_english`.
    english_check: bool = True
    #: Drop hyponym/hypernym/synonym swaps (WordNet; needs the NLTK `wordnet` data).
    avoid_related_nouns: bool = False
    #: `similarity_first` (the reference's order), `perplexity_first` (same choice; fewer
    #: sentence encodes, more LM passes) or `auto`: perplexity first when the LM has fewer
    #: parameters than the sentence model (tiny LM), else similarity first (gpt2-large).
    order: str = "auto"
    #: Perplexity-first: candidates per caption per similarity round.
    probe: int = 4
    #: Captions per MLM forward; candidate sentences per sentence-model / LM forward.
    caption_batch: int = 32
    encode_batch: int = 256
    lm_batch: int = 64


@dataclass
class ImageStageConfig:
    """Example (tests, random tiny CLIP): `ImageStageConfig(candidates=4, steps=2, image_size=64,
    filters=("text_image",), clip_threshold=-1)`; `ImageStageConfig(candidate_plan="grouped",
    seeds=10, p_values=10)` for 100 candidates in 10 groups."""

    #: Which model draws the pairs, and how (`builders.counterfactuals.generators`): `sd15`
    #: (the paper's Prompt-to-Prompt on SD v1.5), `sdxl`, `sd3`, `flux`.
    generator: str = "sd15"
    #: Candidate pairs per caption pair (paper: 100); the grouped plan sets it to seeds x p_values.
    candidates: int = 100
    #: `CANDIDATE_PLANS`; `grouped`: `seeds` groups of `p_values` candidates each.
    candidate_plan: str = "independent"
    seeds: int = 10
    p_values: int = 10
    #: Candidate pairs per UNet batch (the UNet sees at most 4x this: 2 images x guidance
    #: halves); a batch holds whole groups of candidates sharing (seed, guidance).
    candidate_batch: int = 4
    #: Evaluate each distinct UNet row once per step (same images; METHOD.md §2). Off only to
    #: measure or check the saving.
    share: bool = True
    #: Denoising steps and image side (reference: 100 steps, 512x512).
    steps: int = 100
    image_size: int = 512
    #: Ranges of the per-candidate injection fraction p and guidance scale.
    p_range: tuple[float, float] = (0.1, 0.9)
    guidance_range: tuple[float, float] = (7.5, 15.0)
    #: Filters a candidate must pass (`IMAGE_FILTERS`; builders/counterfactuals/METHOD.md §2).
    filters: tuple[str, ...] = IMAGE_FILTERS
    #: `text_image`: minimum caption-image CLIP cosine, for both images (paper: 0.2).
    clip_threshold: float = 0.2
    #: `image_image`: minimum CLIP cosine of the two images (paper, App. B.1.2: 0.7).
    image_similarity_threshold: float = 0.7
    #: `directional`: minimum CLIP directional similarity (the instruct-pix2pix generator's
    #: default, which the paper kept: 0.2).
    directional_threshold: float = 0.2
    #: Stop once this many candidates passed (None: always try all N).
    early_stop: int | None = None
    #: Approximate, off by default (METHOD.md §2): at this fraction of the steps, decode each
    #: candidate's predicted clean image and stop denoising the candidates whose preview fails a
    #: filter by more than `early_reject_margin` (they count as tried, not as passed).
    early_reject_at: float | None = None
    early_reject_margin: float = 0.1
    #: Attention maps injected (`self`, `cross`, `both`; see `builders.counterfactuals.prompt_to_prompt`).
    inject: str = "self"
    #: Sampler: `euler_ancestral` (reference) or `pipeline` (the model's own scheduler).
    scheduler: str = "euler_ancestral"

    def early_reject_step(self) -> int | None:
        """The 0-based step after which candidates are previewed (None: never). A preview after
        the last step would save nothing."""
        if self.early_reject_at is None or self.steps < 2:
            return None
        return min(self.steps - 2, int(self.early_reject_at * (self.steps - 1)))

    def __post_init__(self) -> None:
        if self.generator not in GENERATOR_NAMES:
            raise UserFacingError(f"--generator takes {', '.join(GENERATOR_NAMES)} (got {self.generator!r})")
        if self.candidate_plan not in CANDIDATE_PLANS:
            raise UserFacingError(f"--candidate-plan takes {', '.join(CANDIDATE_PLANS)} "
                                  f"(got {self.candidate_plan!r})")
        if self.candidate_plan == "grouped":
            self.candidates = self.seeds * self.p_values
        unknown = [f for f in self.filters if f not in IMAGE_FILTERS]
        if unknown or not self.filters:
            raise UserFacingError(f"--filters takes one or more of {', '.join(IMAGE_FILTERS)} "
                                  f"(got {', '.join(self.filters) or 'none'})")
        if self.early_reject_at is not None and not 0 < self.early_reject_at < 1:
            raise UserFacingError(f"--early-reject-at takes a fraction of the steps in (0, 1) "
                                  f"(got {self.early_reject_at})")
        if self.early_reject_margin < 0:
            raise UserFacingError(f"--early-reject-margin takes a number >= 0 "
                                  f"(got {self.early_reject_margin})")
        # One canonical order: the same set of filters is the same build.
        self.filters = tuple(f for f in IMAGE_FILTERS if f in self.filters)


@dataclass
class ImageImportConfig:
    """Image pairs that exist already (`--images-from`; builders/counterfactuals/METHOD.md §2,
    "Imported image pairs"). Example: `ImageImportConfig("images.zip")` (layout detected), or
    `ImageImportConfig("pairs/", pattern=("orig/{id}.png", "cf/{id}.png"))`."""

    #: A folder or a zip file holding the images.
    images_from: str
    #: `IMAGE_LAYOUTS`; ignored when `pattern` is given.
    layout: str = "auto"
    #: Names relative to the folder or zip root: one pattern with `{id}` and `{n}` (0: the
    #: original caption's image, 1: the counterfactual's), or one pattern per image with `{id}`.
    pattern: tuple[str, ...] = ()
    #: Score each pair with the CLIP filter (off: the score columns are null; no model runs).
    clip_scores: bool = True
    #: Drop pairs failing the image stage's `filters` at its thresholds (default: scores only).
    apply_filters: bool = False
    #: Skip (count `image_too_large`) images of more pixels, checked before decoding.
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS

    def __post_init__(self) -> None:
        if self.layout not in IMAGE_LAYOUTS:
            raise UserFacingError(f"--images-layout takes {', '.join(IMAGE_LAYOUTS)} (got {self.layout!r})")
        if self.pattern and self.layout != "auto":
            raise UserFacingError("give --images-layout or --images-pattern, not both")
        self.pattern = tuple(self.pattern)
        if self.apply_filters and not self.clip_scores:
            raise UserFacingError("--apply-filters needs the CLIP scores: leave out --no-clip-scores")
        if len(self.pattern) > 2:
            raise UserFacingError(f"--images-pattern takes one pattern (with {{id}} and {{n}}) or "
                                  f"two (one per image, each with {{id}}); got {len(self.pattern)}")


@dataclass
class CocoCounterfactualsConfig:
    """What to build. Example: `CocoCounterfactualsConfig(coco_root="coco", stage="captions",
    models={"mlm": ..., "lm": ..., "sentence": ...})`."""

    stage: str = "all"
    #: COCO source: COCO folders (default `val2017`, as the paper), or Karpathy splits instead.
    coco_root: str | None = None
    coco_splits: tuple[str, ...] | None = None
    karpathy_splits: tuple[str, ...] | None = None
    #: Any `datasets` source with a text column (instead of COCO).
    dataset: str | None = None
    dataset_config: str | None = None
    dataset_split: str = "train"
    text_column: str = "caption"
    id_column: str | None = None
    #: `--stage images`: the caption pairs, a captions build or any caption-pair table (a .tsv or
    #: .jsonl file, a `datasets` folder or Hub id; `builders.counterfactuals.pair_tables`).
    captions_from: str | None = None
    #: Hub revision (branch, tag, commit) and split of a `datasets` table of caption pairs.
    captions_revision: str | None = None
    captions_split: str | None = None
    #: Caption columns of the table (None: the format's default; `id_column` names its ids).
    caption_0_column: str | None = None
    caption_1_column: str | None = None
    #: Draw pairs whose captions differ in more than one word (P2P's word swap assumes one).
    allow_multiword_edits: bool = False
    #: Keep the first N source captions (None: all).
    max_captions: int | None = None
    #: Split name of the published tables (the original release has one `test` split).
    split: str = "test"
    seed: int = 0
    #: Model id or path per role (`MODEL_ROLES`).
    models: dict[str, str] = field(default_factory=dict)
    captions: CaptionStageConfig = field(default_factory=CaptionStageConfig)
    images: ImageStageConfig = field(default_factory=ImageStageConfig)
    #: `--stage images` only: import these image pairs instead of generating them.
    image_import: ImageImportConfig | None = None

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise UserFacingError(f"--stage takes {', '.join(STAGES)} (got {self.stage!r})")
        if self.image_import is not None and self.stage != "images":
            raise UserFacingError(f"--images-from imports image pairs for the caption pairs of "
                                  f"--captions-from: it goes with --stage images (or no --stage), "
                                  f"not --stage {self.stage}")
        if self.stage == "images" and not self.captions_from:
            raise UserFacingError("--stage images needs --captions-from (a captions build, a .tsv "
                                  "or .jsonl file, or a dataset folder or Hub id of caption pairs)")
        if self.stage != "images" and len([x for x in (self.coco_root, self.dataset) if x]) != 1:
            raise UserFacingError("give exactly one caption source: --coco-root DIR or --dataset NAME")
        if self.stage != "images" and self.captions_from:
            raise UserFacingError("--captions-from is only for --stage images")
        table_options = {"--captions-revision": self.captions_revision,
                         "--captions-split": self.captions_split,
                         "--caption-0-column": self.caption_0_column,
                         "--caption-1-column": self.caption_1_column}
        given = [flag for flag, value in table_options.items() if value]
        if given and not self.captions_from:
            raise UserFacingError(f"{', '.join(given)} only apply to --captions-from TABLE")
        if self.coco_splits and self.karpathy_splits:
            raise UserFacingError("give --coco-splits or --karpathy-splits, not both")
        if self.coco_root and not self.karpathy_splits and not self.coco_splits:
            self.coco_splits = DEFAULT_COCO_SPLITS
