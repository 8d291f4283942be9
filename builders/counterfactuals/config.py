"""What a COCO-Counterfactuals build makes: the stages, model roles, and the settings of the two
stages (builders/counterfactuals/METHOD.md §1, §2) under `CocoCounterfactualsConfig`.

Plain dataclasses with no heavy import, whose `option()` fields are the flags of `counterfactory
build coco-counterfactuals` (`builders.engine.options`; `--help` loads no torch or NLTK), and
`TINY`, the sizes that go with `--models tiny`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from builders.counterfactuals.generators import GENERATOR_NAMES, generator
from builders.engine.errors import UserFacingError
from builders.engine.option_types import (
    check_image_side,
    fraction,
    non_negative_int,
    non_negative_number,
    positive_int,
    seed_int,
    steps_int,
)
from builders.engine.options import option
from builders.engine.precision import dtype_option
from builders.models.profiles import tiny_preset
from loading_scripts.image_metadata import strip_metadata_option
from loading_scripts.images import max_image_pixels_option

#: What `--stage` builds: caption pairs, image pairs of an earlier captions build, or both.
STAGES = ("captions", "images", "all")
#: Default of `--max-image-bytes` (an imported image file's bound).
DEFAULT_MAX_IMAGE_BYTES = 16 << 20
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
#: How the caption stage scores candidates (`CaptionStageConfig.order`).
CAPTION_ORDERS = ("auto", "similarity_first", "perplexity_first")
#: How `--images-from` names a row's two images (`builders.counterfactuals.image_sources`):
#: `auto` detects one of the others from the files.
IMAGE_LAYOUTS = ("auto", "folders", "numbered", "release")


@dataclass
class CaptionStageConfig:
    """Example: `CaptionStageConfig(sim_low=0.5, sim_high=0.99)` for a permissive window."""

    #: MLM proposals per noun position (paper: 10).
    top_k: int = option(10, "MLM proposals per noun", type=positive_int)
    #: Keep candidates with `sim_low < similarity <= sim_high` (paper: 0.8, 0.91).
    sim_low: float = option(0.8, "similarity > this")
    sim_high: float = option(0.91, "similarity <= this")
    #: Tags of the positions to replace, and tags the replacement must have (reference values).
    noun_tags: tuple[str, ...] = ("NN", "NNS")
    replacement_tags: tuple[str, ...] = ("NN", "NNS", "NNP")
    #: Captions with fewer words (tokens holding a letter) are dropped as `too_short`.
    min_words: int = option(2, type=non_negative_int)
    #: Drop captions that do not look English (`looks_english`) as `not_english`.
    english_check: bool = option(True, "keep non-English captions", flag="--no-english-check")
    #: Drop hyponym/hypernym/synonym swaps (WordNet; needs the NLTK `wordnet` data).
    avoid_related_nouns: bool = option(False, "drop hyponym/hypernym/synonym swaps (needs NLTK wordnet data)")
    #: `similarity_first` (the reference's order), `perplexity_first` (same choice; fewer
    #: sentence encodes, more LM passes) or `auto`: perplexity first when the LM has fewer
    #: parameters than the sentence model (tiny LM), else similarity first (gpt2-large).
    order: str = option(
        "auto", "scoring order (same choice; auto: by model sizes)", flag="--caption-order", choices=CAPTION_ORDERS
    )
    #: Perplexity-first: candidates per caption per similarity round.
    probe: int = 4
    #: Captions per MLM forward; candidate sentences per sentence-model / LM forward.
    caption_batch: int = option(32, "captions per MLM batch", type=positive_int)
    encode_batch: int = 256
    lm_batch: int = 64


@dataclass
class ImageStageConfig:
    """Example (tests, random tiny CLIP): `ImageStageConfig(candidates=4, steps=2, image_size=64,
    filters=("text_image",), clip_threshold=-1)`; `ImageStageConfig(candidate_plan="grouped",
    seeds=10, p_values=10)` for 100 candidates in 10 groups."""

    #: Which model draws the pairs, and how (`builders.counterfactuals.generators`): `sd15`
    #: (the paper's Prompt-to-Prompt on SD v1.5), `sdxl`, `sd3`, `flux`.
    generator: str = option(
        "sd15",
        "which model draws the image pairs: sd15 (default, the paper's Prompt-to-Prompt on "
        "SD v1.5), sdxl (Prompt-to-Prompt on SDXL base), sd3, flux (Stable Flow vital-layer "
        "injection on MM-DiT; METHOD.md §2, Generators)",
        choices=GENERATOR_NAMES,
    )
    #: Candidate pairs per caption pair (paper: 100); the grouped plan sets it to seeds x p_values.
    candidates: int = option(100, "independent plan: candidate pairs per caption pair (paper: 100)", type=positive_int)
    #: `CANDIDATE_PLANS`; `grouped`: `seeds` groups of `p_values` candidates each.
    candidate_plan: str = option(
        "independent",
        "independent (default, the paper's sampling): a seed, p and guidance per "
        "candidate; grouped: --seeds groups sharing seed and guidance, --p-values p "
        "each, whose UNet work is shared (METHOD.md §2)",
        choices=CANDIDATE_PLANS,
    )
    seeds: int = option(10, "grouped plan: groups (seed, guidance) per caption pair", type=positive_int)
    p_values: int = option(10, "grouped plan: injection fractions per group", type=positive_int)
    #: Candidate pairs per UNet batch (the UNet sees at most 4x this: 2 images x guidance
    #: halves); a batch holds whole groups of candidates sharing (seed, guidance).
    candidate_batch: int = option(4, "candidate pairs per UNet batch (rounded to whole groups)", type=positive_int)
    #: Evaluate each distinct UNet row once per step (same images; METHOD.md §2). Off only to
    #: measure or check the saving.
    share: bool = option(
        True,
        "evaluate every candidate's UNet rows even where candidates share "
        "them (same images, more work: to measure or check the saving)",
        flag="--no-shared-computation",
    )
    #: Denoising steps and image side (reference: 100 steps, 512x512).
    steps: int = option(
        100,
        "denoising steps (default under --models production: the generator model's reference, "
        "sd15 100, sdxl 50, sd3 28, flux 4, FLUX.1-dev 28; METHOD.md §2)",
        type=steps_int,
    )
    image_size: int = option(512, "image side in pixels", type=positive_int)
    #: Ranges of the per-candidate injection fraction p and guidance scale.
    p_range: tuple[float, float] = option((0.1, 0.9), type=fraction, metavar=("LO", "HI"))
    #: Default: the generator model's reference (`generators.Reference`, set by `options`).
    guidance_range: tuple[float, float] = option(
        (7.5, 15.0),
        "per-candidate guidance ~ U(LO, HI) (default: the generator model's reference: sd15 "
        "7.5 15 (the paper), sdxl 5 5, sd3 7 7, flux 0 0 (schnell reads none), FLUX.1-dev 3.5 3.5)",
        type=non_negative_number,
        metavar=("LO", "HI"),
    )
    #: Filters a candidate must pass (`IMAGE_FILTERS`; builders/counterfactuals/METHOD.md §2).
    filters: tuple[str, ...] = option(
        IMAGE_FILTERS,
        "candidate filters to apply (default: all three, as the paper; `--filters "
        "text_image` is the looser caption-image check alone)",
        choices=IMAGE_FILTERS,
    )
    #: `text_image`: minimum caption-image CLIP cosine, for both images (paper: 0.2).
    clip_threshold: float = option(0.2, "text_image filter: minimum caption-image CLIP cosine of both images")
    #: `image_image`: minimum CLIP cosine of the two images (paper, App. B.1.2: 0.7).
    image_similarity_threshold: float = option(0.7, "image_image filter: minimum CLIP cosine of the two images")
    #: `directional`: minimum CLIP directional similarity (the instruct-pix2pix generator's
    #: default, which the paper kept: 0.2).
    directional_threshold: float = option(0.2, "directional filter: minimum CLIP directional similarity")
    #: Stop once this many candidates passed (None: always try all N).
    early_stop: int | None = option(None, "stop once K candidates pass", type=positive_int)
    #: Approximate, off by default (METHOD.md §2): at this fraction of the steps, decode each
    #: candidate's predicted clean image and stop denoising the candidates whose preview fails a
    #: filter by more than `early_reject_margin` (they count as tried, not as passed).
    early_reject_at: float | None = option(
        None,
        "approximate, off by default: after this fraction of the steps, score each "
        "candidate's predicted clean image with CLIP and stop denoising those that fail a "
        "filter by more than --early-reject-margin (METHOD.md §2)",
        metavar="FRACTION",
    )
    early_reject_margin: float = option(
        0.1,
        "early rejection: how far below a filter's threshold a preview must score to be dropped (default %(default)s)",
    )
    #: Attention maps injected (`self`, `cross`, `both`; see `builders.counterfactuals.prompt_to_prompt`).
    inject: str = option(
        "self",
        "maps injected for the first fraction p of steps: self (default, as the paper's "
        "generator): every self-attention map; cross: Prompt-to-Prompt's word swap (the "
        "new word takes the old word's cross-attention map, self maps in low-resolution "
        "layers); both (METHOD.md §2)",
        choices=("self", "cross", "both"),
    )
    #: Prompt-to-Prompt's two fractions (its notebook: cross 0.8, self 0.4), for `--inject
    #: cross|both`: every candidate injects cross maps for the first `cross` and self maps for the
    #: first `self` fraction of the steps (the rows' `p` is the cross one). None (default): one
    #: p ~ U(p_range) per candidate for both, the COCO-Counterfactuals paper's.
    cross_replace_fraction: float | None = option(
        None,
        "--inject cross|both: inject cross-attention maps for this fraction of the steps in every "
        "candidate (Prompt-to-Prompt's cross_replace_steps, its notebook 0.8), with "
        "--self-replace-fraction; default: one p per candidate for both maps, as the paper",
        type=fraction,
        metavar="FRACTION",
    )
    self_replace_fraction: float | None = option(
        None,
        "--inject cross|both: Prompt-to-Prompt's self_replace_steps (its notebook 0.4): the self-attention "
        "maps of the layers of at most 16x16 positions at 512 px, conditional half, are injected for this "
        "fraction of the steps (both's other self maps follow --cross-replace-fraction); with "
        "--cross-replace-fraction",
        type=fraction,
        metavar="FRACTION",
    )
    #: sd3, flux: the transformer blocks that inject (indices of `vital_layers_file.block_names`: FLUX's
    #: double-stream blocks, then its single-stream ones, as Stable Flow numbers them) instead of
    #: the published set; `vital_layers_from`: the JSON `counterfactory doctor vital-layers`
    #: writes, read and checked by `vital_layers_file.read_vital_layers` (from
    #: `options.config_from_args`) into `vital_layers` and its provenance.
    vital_layers: tuple[int, ...] = option(
        (),
        "sd3, flux: the blocks that inject, instead of the published ones (FLUX: Stable Flow's "
        "0 1 17 18 25 28 53 54 56, measured on FLUX.1-dev; SD3: 0 7 8 9, UNMEASURED, no checked source): e.g. the list "
        "`counterfactory doctor vital-layers` prints (METHOD.md §6)",
        metavar="N",
    )
    vital_layers_from: str | None = option(
        None,
        "sd3, flux: the JSON `counterfactory doctor vital-layers` wrote: its layers, with their "
        "measurement recorded in the manifest and card; refused unless measured on the model this "
        "build loads (generator, model, blocks, config hash) with distinct block indices (at most 1 MiB)",
        metavar="JSON",
    )
    vital_layers_provenance: dict | None = None
    #: Sampler: `euler_ancestral` (reference) or `pipeline` (the model's own scheduler).
    scheduler: str = option(
        "euler_ancestral",
        "euler_ancestral (default, as the paper's generator); dpm_solver_pp: "
        "DPM-Solver++ for fewer steps (e.g. --steps 25; other images, METHOD.md "
        "§2); pipeline: the model's own scheduler",
        choices=("euler_ancestral", "dpm_solver_pp", "pipeline"),
    )
    #: The model's reference entry (`model_references.ModelReference.record`), decided once from
    #: its configs by `options.config_from_args`: the default steps and guidance, the T5 length
    #: and the dtype of `--dtype auto` (None: decided from the loaded pipeline).
    reference: dict | None = None

    def early_reject_step(self) -> int | None:
        """The 0-based step after which candidates are previewed (None: never). A preview after
        the last step would save nothing."""
        if self.early_reject_at is None or self.steps < 2:
            return None
        return min(self.steps - 2, int(self.early_reject_at * (self.steps - 1)))

    def __post_init__(self) -> None:
        generator(self.generator)  # the registry's own check of the name
        if self.candidate_plan not in CANDIDATE_PLANS:
            raise UserFacingError(f"--candidate-plan takes {', '.join(CANDIDATE_PLANS)} (got {self.candidate_plan!r})")
        if self.candidate_plan == "grouped":
            self.candidates = self.seeds * self.p_values
        unknown = [f for f in self.filters if f not in IMAGE_FILTERS]
        if unknown or not self.filters:
            raise UserFacingError(
                f"--filters takes one or more of {', '.join(IMAGE_FILTERS)} (got {', '.join(self.filters) or 'none'})"
            )
        if self.early_reject_at is not None and not 0 < self.early_reject_at < 1:
            raise UserFacingError(
                f"--early-reject-at takes a fraction of the steps in (0, 1) (got {self.early_reject_at})"
            )
        if self.early_reject_margin < 0:
            raise UserFacingError(f"--early-reject-margin takes a number >= 0 (got {self.early_reject_margin})")
        # One canonical order: the same set of filters is the same build.
        self.filters = tuple(f for f in IMAGE_FILTERS if f in self.filters)
        self._check_fractions()
        self._check_ranges()

    def _check_ranges(self) -> None:
        """The ranges' ends in order, and a side the generator draws (`check_image_side`)."""
        for flag, (low, high) in (("--p-range", self.p_range), ("--guidance-range", self.guidance_range)):
            if low > high:
                raise UserFacingError(f"{flag} {low:g} {high:g}: give the low end first ({high:g} {low:g})")
        spec = generator(self.generator)
        check_image_side(self.image_size, spec.size_multiple, "--image-size", f"the {spec.name} generator")

    def _check_fractions(self) -> None:
        given = [x is not None for x in (self.cross_replace_fraction, self.self_replace_fraction)]
        if not any(given):
            return
        if not all(given):
            raise UserFacingError("give --cross-replace-fraction and --self-replace-fraction together")
        if self.inject == "self":
            raise UserFacingError(
                "--cross-replace-fraction and --self-replace-fraction are Prompt-to-Prompt's word "
                "swap fractions: give them with --inject cross or --inject both"
            )
        if self.candidate_plan == "grouped":
            raise UserFacingError(
                "--cross-replace-fraction fixes every candidate's fractions: use --candidate-plan "
                "independent (the grouped plan's --p-values would all be the same)"
            )


@dataclass
class ImageImportConfig:
    """Image pairs that exist already (`--images-from`; builders/counterfactuals/METHOD.md §2,
    "Imported image pairs"). Example: `ImageImportConfig("images.zip")` (layout detected), or
    `ImageImportConfig("pairs/", pattern=("orig/{id}.png", "cf/{id}.png"))`."""

    #: A folder or a zip file holding the images.
    images_from: str = option(
        help="a folder or a .zip (read in place) holding each row's two images", metavar="DIR_OR_ZIP"
    )
    #: `IMAGE_LAYOUTS`; ignored when `pattern` is given.
    layout: str = option(
        "auto",
        "how the images are named: folders (synthetic-images-for-original-captions/{id}.jpg "
        "and synthetic-images-for-counterfactual-captions/{id}.jpg, the paper's evaluation "
        "code), numbered ({id}_0.jpg, {id}_1.jpg), release ({id}_img_0.jpg, "
        "{id}_img_1.jpg, the Hub release's images.zip); default auto: detected, at the top "
        "or under one top-level folder",
        flag="--images-layout",
        choices=IMAGE_LAYOUTS,
    )
    #: Names relative to the folder or zip root: one pattern with `{id}` and `{n}` (0: the
    #: original caption's image, 1: the counterfactual's), or one pattern per image with `{id}`.
    pattern: tuple[str, ...] = option(
        (),
        "names relative to the folder or zip root instead of a layout: one pattern with {id} "
        "and {n} (0 original, 1 counterfactual), e.g. 'pairs/{id}-{n}.png', or two patterns "
        "with {id}, one per image",
        flag="--images-pattern",
        metavar="PATTERN",
    )
    #: Score each pair with the CLIP filter (off: the score columns are null; no model runs).
    clip_scores: bool = option(
        True,
        "import without scoring the pairs with the CLIP filter (no model runs; the score "
        "columns are null): minutes instead of hours on a CPU",
        flag="--no-clip-scores",
    )
    #: Drop pairs failing the image stage's `filters` at its thresholds (default: scores only).
    apply_filters: bool = option(
        False,
        "drop imported pairs failing --filters at their thresholds (default: the CLIP "
        "scores are recorded, every pair is kept)",
    )
    #: Skip (count `image_too_large`) image files of more bytes, unread: far above a real image
    #: (the release's 512 x 512 JPEGs average 183 kB; a 2048 x 2048 photo PNG is about 8 MB), so
    #: a member padded to hundreds of MB cannot take the memory (a part also has a bound:
    #: `imports.PART_IMAGE_BYTES`).
    max_image_bytes: int = option(
        DEFAULT_MAX_IMAGE_BYTES,
        "skip (and count as image_too_large) an image file of more bytes, unread (default %(default)s, "
        "about 90 times the release's average image)",
        type=positive_int,
        metavar="N",
    )
    #: Drop the images' metadata (EXIF with its GPS position, XMP, comments) losslessly before
    #: storing them (`loading_scripts/image_metadata.py`); off: stored byte for byte.
    strip_metadata: bool = strip_metadata_option()
    #: Skip (count `image_too_large`) images of more pixels, checked before decoding.
    max_image_pixels: int = max_image_pixels_option()

    def __post_init__(self) -> None:
        if self.layout not in IMAGE_LAYOUTS:
            raise UserFacingError(f"--images-layout takes {', '.join(IMAGE_LAYOUTS)} (got {self.layout!r})")
        if self.pattern and self.layout != "auto":
            raise UserFacingError("give --images-layout or --images-pattern, not both")
        self.pattern = tuple(self.pattern)
        if self.apply_filters and not self.clip_scores:
            raise UserFacingError("--apply-filters needs the CLIP scores: leave out --no-clip-scores")
        if len(self.pattern) > 2:
            raise UserFacingError(
                f"--images-pattern takes one pattern (with {{id}} and {{n}}) or "
                f"two (one per image, each with {{id}}); got {len(self.pattern)}"
            )


@dataclass
class CocoCounterfactualsConfig:
    """What to build. Example: `CocoCounterfactualsConfig(coco_root="coco", stage="captions",
    models={"mlm": ..., "lm": ..., "sentence": ...})`."""

    stage: str = option("all", "what to build (default: all; images with --images-from)", choices=STAGES)
    #: COCO source: COCO folders (default `val2017`, as the paper), or Karpathy splits instead.
    coco_root: str | None = option(None, "root of a COCO download")
    coco_splits: tuple[str, ...] | None = option(
        None,
        f"COCO folders to read, captions in annotation-file order (default: "
        f"{' '.join(DEFAULT_COCO_SPLITS)}, as the paper)",
    )
    karpathy_splits: tuple[str, ...] | None = option(
        None, "read these Karpathy splits instead of --coco-splits", choices=("train", "restval", "val", "test")
    )
    #: Any `datasets` source with a text column (instead of COCO).
    dataset: str | None = option(None, "a `datasets` dataset (Hub id or folder)")
    dataset_config: str | None = option(None)
    dataset_split: str = option("train")
    text_column: str = option("caption")
    id_column: str | None = option(None, "row id column (default: row index; --captions-from: by format)")
    #: `--stage images`: the caption pairs, a captions build or any caption-pair table (a .tsv or
    #: .jsonl file, a `datasets` folder or Hub id; `builders.counterfactuals.pair_tables`).
    captions_from: str | None = option(
        None,
        "--stage images: the caption pairs: a captions build folder, a .tsv (id, caption_0, "
        "caption_1) or .jsonl file (coco-counterfactual-index, original_caption, "
        "counterfactual_caption), or a `datasets` folder or Hub id with caption_0/caption_1 "
        "columns (METHOD.md §2)",
    )
    #: Hub revision (branch, tag, commit) and split of a `datasets` table of caption pairs.
    captions_revision: str | None = option(None, "--captions-from HUB_ID: branch, tag or commit")
    captions_split: str | None = option(None, "--captions-from a dataset: its split (default: its only one)")
    #: Caption columns of the table (None: the format's default; `id_column` names its ids).
    caption_0_column: str | None = option(None, "--captions-from a table: original caption column (default by format)")
    caption_1_column: str | None = option(
        None, "--captions-from a table: counterfactual caption column (default by format)"
    )
    #: Draw pairs whose captions differ in more than one word (P2P's word swap assumes one).
    allow_multiword_edits: bool = option(
        False,
        "--captions-from a table: also draw pairs whose captions differ in more than one "
        "word (counted and skipped otherwise)",
    )
    #: Keep the first N source captions (None: all).
    max_captions: int | None = option(None, "first N source captions", type=positive_int)
    #: Split name of the published tables (the original release has one `test` split).
    split: str = option("test", "split name of the output (default %(default)s)", flag="--output-split")
    seed: int = option(0, type=seed_int)
    #: How the build runs, not what it builds (`info` leaves them out of the recorded config):
    #: the torch device (None: `distributed.worker_device`); the image stage's precision,
    #: recorded resolved on the device (`precision`); intra-op CPU threads (None: torch's); CPU
    #: offload (the same images).
    device: str | None = option(None, "torch device (default: own GPU, else CPU)")
    dtype: str = dtype_option(
        "the image stage's generator and CLIP filter (the caption stage's text models run in fp32)",
        cuda="the generator's reference dtype (bf16 for flux, fp32 on a GPU without bf16; fp16 for the others)",
    )
    torch_threads: int | None = option(
        None,
        "intra-op CPU threads per process; give the same value to runs whose shards must be "
        "bit-identical (accelerate workers default to 1)",
        type=positive_int,
    )
    #: Keep the generator's weights in CPU memory, each model on the GPU only while it runs.
    cpu_offload: bool = option(
        False,
        "keep the generator's weights in CPU memory and move each model to the GPU only "
        "while it runs (diffusers' enable_model_cpu_offload): for GPUs that cannot hold the "
        "pipeline (FLUX.1 in bf16); same images, slower",
    )
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
            raise UserFacingError(
                f"--images-from imports image pairs for the caption pairs of "
                f"--captions-from: it goes with --stage images (or no --stage), "
                f"not --stage {self.stage}"
            )
        if self.stage == "images" and not self.captions_from:
            raise UserFacingError(
                "--stage images needs --captions-from (a captions build, a .tsv "
                "or .jsonl file, or a dataset folder or Hub id of caption pairs)"
            )
        if self.stage != "images" and len([x for x in (self.coco_root, self.dataset) if x]) != 1:
            raise UserFacingError("give exactly one caption source: --coco-root DIR or --dataset NAME")
        if self.stage != "images" and self.captions_from:
            raise UserFacingError("--captions-from is only for --stage images")
        table_options = {
            "--captions-revision": self.captions_revision,
            "--captions-split": self.captions_split,
            "--caption-0-column": self.caption_0_column,
            "--caption-1-column": self.caption_1_column,
        }
        given = [flag for flag, value in table_options.items() if value]
        if given and not self.captions_from:
            raise UserFacingError(f"{', '.join(given)} only apply to --captions-from TABLE")
        if self.coco_splits and self.karpathy_splits:
            raise UserFacingError("give --coco-splits or --karpathy-splits, not both")
        if self.coco_root and not self.karpathy_splits and not self.coco_splits:
            self.coco_splits = DEFAULT_COCO_SPLITS


#: The sizes that go with `--models tiny` (builders.models.profiles): random-init models make
#: nothing better at 512 px and 100 steps, only slower.
TINY = tiny_preset(
    CocoCounterfactualsConfig,
    {
        "images": {
            "candidates": 4,
            "seeds": 2,
            "p_values": 3,
            "steps": 2,
            "image_size": 64,
            # Random tiny CLIP scores sit near 0: with the paper's thresholds no candidate would pass.
            "clip_threshold": -1.0,
            "image_similarity_threshold": -1.0,
            "directional_threshold": -1.0,
        }
    },
)
