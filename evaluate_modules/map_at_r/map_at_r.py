"""mAP@R, R-Precision, Recall@K and the ECCV Caption suite for retrieval (evaluate module).

The metric code is in the helper modules of this Space (`retrieval`, `id_lists`, `topk`, `eccv_suite`,
`eccv_annotations`), imported relatively so that `evaluate.load` downloads them too; every helper
must be imported here, because evaluate does not follow the helpers' own imports.
"""

import datasets
import evaluate

from .eccv_annotations import pm_positives_from_instances
from .eccv_annotations import read_pm_positives
from .eccv_annotations import read_positives
from .eccv_suite import DEFAULT_TARGET_METRICS
from .eccv_suite import EccvAnnotations
from .eccv_suite import EccvSuiteConfig
from .eccv_suite import eccv_suite
from .eccv_suite import eccv_suite_from_similarity
from .id_lists import check_id_lists
from .retrieval import RetrievalMetricConfig
from .retrieval import retrieval_scores
from .retrieval import retrieval_scores_from_similarity
from .topk import RetrievalInputError

_CITATION = """\
@inproceedings{chun2022eccv_caption,
  title     = {ECCV Caption: Correcting False Negatives by Collecting Machine-and-Human-verified Image-Caption Associations for MS-COCO},
  author    = {Chun, Sanghyuk and Kim, Wonjae and Park, Song and Chang, Minsuk and Oh, Seong Joon},
  booktitle = {European Conference on Computer Vision (ECCV)},
  year      = {2022}
}
@inproceedings{musgrave2020metric,
  title     = {A Metric Learning Reality Check},
  author    = {Musgrave, Kevin and Belongie, Serge and Lim, Ser-Nam},
  booktitle = {European Conference on Computer Vision (ECCV)},
  year      = {2020}
}
"""

_DESCRIPTION = """\
mAP@R (Musgrave et al., 2020) scores a retrieval ranking against *all* R positives of a query:
with rprecision(r) = |set(t[:r]) & G| / |set(t[:r])|, AP@R = (1/R) sum_{r<=R} 1[t[r-1] in G]
rprecision(r), and mAP@R is its mean over queries. R-Precision is rprecision(R), R@1 is
1[t[0] in G] and R@K is 1[set(t[:K]) & G non-empty]. The definitions, and every number, are those
of the `eccv_caption` 0.1.0 package (ECCV Caption, Chun et al., 2022). Besides ranked id lists,
the module takes a query x gallery similarity matrix (ranked with ties in gallery order) and
computes the whole ECCV Caption suite: ECCV mAP@R / R-Precision / R@K, COCO 1K and 5K R@K, CxC
R@K and PMRP, with the annotations shipped in `eccv_caption`.
"""

_KWARGS_DESCRIPTION = """
Computes mAP@R, R-Precision and R@K; or, with keyword arguments only, the same from a similarity
matrix or the ECCV Caption suite.

Args:
    predictions (`list` of `list` of `int`): per query, the retrieved ids, best first. A query
        needs max(R, max(k_values)) of them (fewer raises a ValueError naming the query).
    references (`list` of `list` of `int`): per query, its positive ids (R = distinct count).
    k_values (`list` of `int`, defaults to [1, 5, 10]): the K of R@K.
    map_at_r (`bool`, defaults to True), r_precision (`bool`, defaults to True): compute them.
    r_precision_cap (`int`, optional): R-Precision at min(R, cap) (PMRP uses 50).
    allow_duplicates (`bool`, defaults to False): a ranking that repeats an id raises a
        ValueError naming the query; True scores repeats like eccv_caption 0.1.0 (a repeated
        positive counts at every position, so [10, 10, 10] against {10, 11, 12} reaches
        mAP@R 1.0). Only for parity runs against eccv_caption.

    Ids must be integers that fit int64 (-2**63 to 2**63 - 1): floats, bools and larger ids raise
    a ValueError naming the argument and the query (floats are not truncated, bools not read as
    0/1, large ids not wrapped around), in every mode and in add/add_batch. k_values and
    r_precision_cap are positive integers up to 2**63 - 1.

    Step by step: `add_batch(predictions=..., references=...)` (or `add(prediction=...,
    reference=...)` for one query) checks and buffers queries, and `compute(k_values=...)` scores
    every buffered query. Inputs given to that compute call are scored together with the
    buffered ones, as in every evaluate module. The similarity and ECCV Caption modes below take
    all their input in one compute call: add/add_batch reject their arguments, and they raise
    while queries are buffered.

    Similarity mode (keyword arguments, not sent through Arrow, so 5,000 x 25,000 is fine):
    similarity (`numpy.ndarray` or `torch.Tensor`): [queries x gallery] scores, higher is better.
    positives (`list` of `list` of `int`, or `dict` query id -> ids): the positives per row (or
        per query id in `query_ids`).
    query_ids, gallery_ids (`list` of `int`, optional): row / column ids (default: positions).

    ECCV Caption mode (COCO 5K test split ids; output `{metric: {"i2t": x, "t2i": y}}`):
    i2t_rankings, t2i_rankings (`dict`): COCO image id -> ranked caption ids (a list per query),
        caption id -> ranked image ids; or
    i2t_similarity (`numpy.ndarray`): [images x captions] scores with `image_ids` and
        `caption_ids` (and optionally a [captions x images] `t2i_similarity`).
    target_metrics (`list` of `str`): as in eccv_caption, default coco_1k_r1, coco_5k_r1, cxc_r1,
        eccv_r1, eccv_map_at_r; `{coco_1k,coco_5k,cxc,eccv}_recalls` give R@K for k_values,
        plus eccv_rprecision and pmrp.
    pm_dir (`str`, optional): folder with the official pm_*.json files, for pmrp; or
    coco_instances (`str`, optional): COCO instances_val2014.json to compute PM positives from,
        with `pm_zeta` (`int`, defaults to 0) differing classes allowed.

Returns:
    `map_at_r`, `r_precision`, `recall_at_{k}` (`float`, 0-1) and `num_queries` (`int`); in ECCV
    Caption mode, `{metric: {"i2t": float, "t2i": float}}`.

Examples:

    Ranked id lists (AP@R of the two queries: 0.5556 and 0.3889):

    >>> metric = evaluate.load("map_at_r")
    >>> results = metric.compute(predictions=[[10, 99, 11, 12], [99, 10, 11, 12]],
    ...                          references=[[10, 11, 12], [10, 11, 12]], k_values=[1, 2])
    >>> print({k: round(v, 4) for k, v in results.items()})
    {'map_at_r': 0.4722, 'r_precision': 0.6667, 'recall_at_1': 0.5, 'recall_at_2': 1.0, 'num_queries': 2}

    A similarity matrix; ties rank in gallery order, so in row 0 column 0 beats the positive 2:

    >>> import numpy as np
    >>> scores = np.array([[0.9, 0.1, 0.9], [0.2, 0.8, 0.3]])
    >>> results = metric.compute(similarity=scores, positives=[[2], [1, 2]], k_values=[1])
    >>> print(results)
    {'map_at_r': 0.5, 'r_precision': 0.5, 'recall_at_1': 0.5, 'num_queries': 2}
"""

_ID_LIST = datasets.Sequence(datasets.Value("int64"))
_KEYWORD_MODES = ("similarity", "i2t_rankings", "t2i_rankings", "i2t_similarity")


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class RetrievalMapAtR(evaluate.Metric):
    """mAP@R family and the ECCV Caption suite (Chun et al., 2022)."""

    def _info(self):
        return evaluate.MetricInfo(
            module_type="metric",
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": _ID_LIST, "references": _ID_LIST}),
            reference_urls=["https://github.com/naver-ai/eccv-caption", "https://arxiv.org/abs/2204.03359"],
        )

    def add_batch(self, *, predictions=None, references=None, **kwargs):
        """Buffer a batch of queries for a later `compute()`, checked like `compute`'s inputs."""
        _reject_keyword_modes(kwargs, "add_batch")
        # Checked before Arrow, whose int64 features would turn 10.7 into 10 and True into 1.
        check_id_lists(predictions, "predictions")
        check_id_lists(references, "references")
        if len(predictions) == 0 or len(references) == 0:
            raise RetrievalInputError("no queries: predictions and references are empty")
        super().add_batch(predictions=predictions, references=references, **kwargs)

    def add(self, *, prediction=None, reference=None, **kwargs):
        """Buffer one query for a later `compute()`, checked like `compute`'s inputs."""
        _reject_keyword_modes(kwargs, "add")
        check_id_lists(prediction, "prediction", single=True)
        check_id_lists(reference, "reference", single=True)
        super().add(prediction=prediction, reference=reference, **kwargs)

    def compute(self, *, predictions=None, references=None, **kwargs):
        """Compute the metrics (evaluate appends the argument description below)."""
        # Matrices and id-keyed dicts bypass Arrow (a 5,000 x 25,000 matrix through Arrow costs
        # tens of seconds and gigabytes); those modes have no per-row features to add.
        if any(kwargs.get(name) is not None for name in _KEYWORD_MODES):
            if predictions is not None or references is not None:
                raise ValueError(
                    "pass either predictions/references (ranked lists) or a "
                    "similarity matrix / ECCV rankings, not both"
                )
            if len(self):  # evaluate's count of buffered queries
                raise ValueError(
                    "queries buffered with add/add_batch are waiting for compute() "
                    "without a similarity matrix / ECCV rankings; those modes take "
                    "all their input in one compute call"
                )
            return self._keyword_mode(**kwargs)
        if predictions is None and references is None and not len(self):
            raise RetrievalInputError(
                "no queries: pass predictions= and references=, or buffer them with add/add_batch before compute()"
            )
        # evaluate's compute sends given predictions/references through `add_batch` (checked
        # there) and then scores every buffered query.
        return super().compute(predictions=predictions, references=references, **kwargs)

    def _compute(
        self,
        predictions,
        references,
        k_values=(1, 5, 10),
        map_at_r=True,
        r_precision=True,
        r_precision_cap=None,
        allow_duplicates=False,
    ):
        config = _metric_config(k_values, map_at_r, r_precision, r_precision_cap, allow_duplicates)
        scores = retrieval_scores(predictions, references, config)
        return {**scores.as_dict(), "num_queries": scores.num_queries}

    def _keyword_mode(
        self,
        similarity=None,
        positives=None,
        query_ids=None,
        gallery_ids=None,
        k_values=(1, 5, 10),
        map_at_r=True,
        r_precision=True,
        r_precision_cap=None,
        allow_duplicates=False,
        i2t_rankings=None,
        t2i_rankings=None,
        i2t_similarity=None,
        image_ids=None,
        caption_ids=None,
        t2i_similarity=None,
        target_metrics=DEFAULT_TARGET_METRICS,
        pm_dir=None,
        coco_instances=None,
        pm_zeta=0,
    ):
        if similarity is not None:
            if positives is None:
                raise ValueError(
                    "similarity needs positives: one positive-id list per row, or a dict query id -> positive ids"
                )
            config = _metric_config(k_values, map_at_r, r_precision, r_precision_cap, allow_duplicates)
            scores = retrieval_scores_from_similarity(similarity, positives, query_ids, gallery_ids, config)
            return {**scores.as_dict(), "num_queries": scores.num_queries}
        suite = EccvSuiteConfig(
            target_metrics=tuple(target_metrics), k_values=tuple(k_values), allow_duplicates=bool(allow_duplicates)
        )
        annotations = EccvAnnotations.load(pm=_pm_positives(pm_dir, coco_instances, pm_zeta))
        if i2t_similarity is not None:
            if image_ids is None or caption_ids is None:
                raise ValueError(
                    "i2t_similarity needs image_ids (its rows) and caption_ids (its columns), as COCO ids"
                )
            return eccv_suite_from_similarity(
                i2t_similarity, image_ids, caption_ids, suite, annotations, t2i_similarity
            )
        if i2t_rankings is None or t2i_rankings is None:
            raise ValueError("the ECCV Caption suite needs both i2t_rankings and t2i_rankings")
        return eccv_suite(i2t_rankings, t2i_rankings, suite, annotations)


def _reject_keyword_modes(kwargs, method):
    modes = [name for name in _KEYWORD_MODES if name in kwargs]
    if modes:
        raise ValueError(
            f"{', '.join(modes)} cannot go through {method}: the similarity and ECCV "
            "Caption modes bypass evaluate's buffering, so pass all of their input "
            "to one compute(...) call"
        )


def _metric_config(k_values, map_at_r, r_precision, r_precision_cap, allow_duplicates):
    try:
        ks = tuple(k_values)
    except TypeError:
        raise RetrievalInputError(f"k_values must be a list of integers, got {k_values!r}") from None
    return RetrievalMetricConfig(
        k_values=ks,
        map_at_r=bool(map_at_r),
        r_precision=bool(r_precision),
        r_precision_cap=r_precision_cap,
        allow_duplicates=bool(allow_duplicates),
    )


def _pm_positives(pm_dir, coco_instances, pm_zeta):
    if pm_dir is not None and coco_instances is not None:
        raise ValueError("give pm_dir or coco_instances for PMRP, not both")
    if pm_dir is not None:
        return read_pm_positives(pm_dir)
    if coco_instances is not None:
        return pm_positives_from_instances(coco_instances, read_positives("coco").i2t, pm_zeta)
    return None
