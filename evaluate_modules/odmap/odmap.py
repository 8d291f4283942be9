"""ODmAP@k: object-decorrelation mAP for image-to-text retrieval (evaluate module).

The metric code is in the helper modules of this Space (`odmap_scores`, `class_match`,
`noun_phrases`), imported relatively so that `evaluate.load` downloads them too; every helper
must be imported here, because evaluate does not follow the helpers' own imports. Text mode needs
NLTK's POS tagger data; without it the error names the one download command.
"""

import datasets
import evaluate
import numpy as np

from .class_match import ClassMatcher
from .noun_phrases import ensure_tagger
from .odmap_scores import DEFAULT_K_VALUES
from .odmap_scores import odmap
from .odmap_scores import odmap_from_topk
from .odmap_scores import per_class_odmap
from .odmap_scores import plot_per_class

_CITATION = """\
@inproceedings{kim2023exposing,
  title     = {Exposing and Mitigating Spurious Correlations for Cross-Modal Retrieval},
  author    = {Kim, Jae Myung and Koepke, A. Sophia and Schmid, Cordelia and Akata, Zeynep},
  booktitle = {Proceedings of the IEEE/CVF Conference on Computer Vision and Pattern Recognition (CVPR) Workshops},
  year      = {2023}
}
"""

_DESCRIPTION = """\
ODmAP@k measures whether an image-to-text retrieval model retrieves captions for what is in the
image rather than for objects that usually co-occur with it. Queries are images from which some
object classes were removed (inpainted away). A retrieved caption is correct iff none of its noun
phrases mentions a removed class and some noun phrase mentions a class still present
(`require_present="any"`, or every present class with `"all"`). With rel(i) the correctness of
the i-th retrieved caption, P(i) = (1/i) sum_{j<=i} rel(j), AP@k = (1/k) sum_{i<=k} rel(i) P(i),
and ODmAP@k is the mean of AP@k over queries; ODmAP@1 is the fraction of queries whose top-1
caption is correct. Noun phrases come from NLTK chunking (cached per unique caption); classes are
matched to noun phrases with the COCO table of the paper (Appendix A) or a user-supplied table.
"""

_KWARGS_DESCRIPTION = """
Computes ODmAP@k for each k in `k_values`.

Args:
    retrieved (`list` of `list` of `str` or `int`): per query, the retrieved captions best first
        (caption texts), or their gallery indices when `mention_matrix` is given. At least
        max(k_values) per query.
    removed_classes (`list` of `list` of `str`): per query, the removed class names.
    present_classes (`list` of `list` of `str`): per query, the class names still in the image.
    k_values (`list` of `int`, defaults to [1, 5, 10]): the k of ODmAP@k.
    require_present (`str`, defaults to "any"): "any" or "all" present classes must be mentioned.
    table (`dict` or `str`, optional): class -> related words, or a JSON file of it, for datasets
        other than COCO (default: the COCO table).
    mention_matrix (`numpy.ndarray` or `scipy.sparse` matrix, optional): [gallery x classes] bool,
        caption g mentions class c (see `odmap_scores.gallery_mentions` in this Space). Passed as
        a keyword argument, it bypasses Arrow; with it, `retrieved` holds gallery indices.
    class_names (`list` of `str`, optional): the class of each mention_matrix column (defaults to
        the table's classes in table order, i.e. the 80 COCO classes of
        `class_match.COCO_CLASSES` in this Space).
    allow_duplicates (`bool`, defaults to False): with mention_matrix, a ranking that repeats a
        gallery index raises a ValueError naming the query; True scores every position as given
        (a repeat counts at each of its positions). Caption texts may repeat: distinct gallery
        captions can share a text.
    per_class_plot_path (`str`, optional): write a bar chart of ODmAP@k per removed class there
        (png/pdf/svg; needs matplotlib). Class names are drawn as written (no TeX math).

    Bad input raises a ValueError naming the query: a class list given as a bare string, float
    or bool gallery indices, indices outside int64 (-2**63 to 2**63 - 1; they must also be rows
    of mention_matrix), caption texts together with a mention_matrix, a mention_matrix that is
    not 2-D, no queries.

    Step by step: `add_batch(retrieved=..., removed_classes=..., present_classes=...)` (or `add`
    for one query) checks and buffers queries, caption texts or gallery indices (not both), and
    `compute(...)` with the other arguments above scores every buffered query. Inputs given to
    that compute call are scored together with the buffered ones, as in every evaluate module.

Returns:
    `ODmAP@k` (`float`) for each k in k_values, and `num_queries` (`int`); with
    `per_class_plot_path`, also `per_class` ({class: {"ODmAP@k": float}}) and the path written.

Examples:

    Captions as text (noun phrases are chunked with NLTK's tagger):

    >>> odmap = evaluate.load("odmap")
    >>> results = odmap.compute(
    ...     retrieved=[["a dog on the grass", "a man with a dog"],
    ...                ["a man with a dog", "a dog on the grass"]],
    ...     removed_classes=[["person"], ["person"]],
    ...     present_classes=[["dog"], ["dog"]],
    ...     k_values=[1, 2],
    ... )
    >>> print(results)
    {'ODmAP@1': 0.5, 'ODmAP@2': 0.375, 'num_queries': 2}

    Fast path for a large gallery: top-k gallery indices plus a precomputed mention matrix:

    >>> import numpy as np
    >>> mentions = np.array([[True, False], [False, True], [True, True]])
    >>> results = odmap.compute(
    ...     retrieved=[[1, 2], [2, 0]],
    ...     removed_classes=[["cat"], ["cat"]],
    ...     present_classes=[["dog"], ["dog"]],
    ...     mention_matrix=mentions,
    ...     class_names=["cat", "dog"],
    ...     k_values=[1, 2],
    ... )
    >>> print(results)
    {'ODmAP@1': 0.5, 'ODmAP@2': 0.25, 'num_queries': 2}
"""

_CLASS_LIST = datasets.Sequence(datasets.Value("string"))
_INT64 = np.iinfo(np.int64)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Odmap(evaluate.Metric):
    """ODmAP@k (Kim et al., 2023)."""

    def _info(self):
        return evaluate.MetricInfo(
            module_type="metric",
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features(
                    {
                        "retrieved": datasets.Sequence(datasets.Value("string")),
                        "removed_classes": _CLASS_LIST,
                        "present_classes": _CLASS_LIST,
                    }
                ),
                datasets.Features(
                    {
                        "retrieved": datasets.Sequence(datasets.Value("int64")),
                        "removed_classes": _CLASS_LIST,
                        "present_classes": _CLASS_LIST,
                    }
                ),
            ],
            reference_urls=[
                "https://github.com/ExplainableML/Spurious_CM_Retrieval",
            ],
        )

    def add_batch(self, *, retrieved=None, removed_classes=None, present_classes=None, **kwargs):
        """Buffer a batch of queries for a later `compute()`, checked like `compute`'s inputs."""
        _reject_compute_only(kwargs, "add_batch")
        retrieved = _numpy_if_torch(retrieved)
        _check_batch(retrieved, removed_classes, present_classes, self._buffered_kind())
        super().add_batch(retrieved=retrieved, removed_classes=removed_classes, present_classes=present_classes)

    def add(self, *, retrieved=None, removed_classes=None, present_classes=None, **kwargs):
        """Buffer one query for a later `compute()`, checked like `compute`'s inputs."""
        _reject_compute_only(kwargs, "add")
        retrieved = _numpy_if_torch(retrieved)
        # One query, checked as a batch of one.
        rows = [None if x is None else [x] for x in (retrieved, removed_classes, present_classes)]
        _check_batch(*rows, self._buffered_kind(), single=True)
        super().add(retrieved=retrieved, removed_classes=removed_classes, present_classes=present_classes)

    def compute(self, *, retrieved=None, removed_classes=None, present_classes=None, **kwargs):
        """Compute ODmAP@k (evaluate appends the argument description below)."""
        if (
            retrieved is None and removed_classes is None and present_classes is None and not len(self)
        ):  # evaluate's count of buffered queries
            raise ValueError(
                "retrieved is missing: pass retrieved=, removed_classes= and "
                "present_classes= (one entry per query), or buffer queries with "
                "add/add_batch before compute()"
            )
        # evaluate's compute sends given inputs through `add_batch` (checked there, before Arrow
        # could cast float indices) and then scores every buffered query.
        return super().compute(
            retrieved=retrieved, removed_classes=removed_classes, present_classes=present_classes, **kwargs
        )

    def _buffered_kind(self):
        """ "texts" or "indices" for the queries already buffered, None when there are none."""
        if not len(self):
            return None
        dtype = self.selected_feature_format["retrieved"].feature.dtype
        return "texts" if dtype == "string" else "indices"

    def _compute(
        self,
        retrieved,
        removed_classes,
        present_classes,
        k_values=DEFAULT_K_VALUES,
        require_present="any",
        table=None,
        mention_matrix=None,
        class_names=None,
        allow_duplicates=False,
        per_class_plot_path=None,
    ):
        # The kind of the buffered rankings (one kind per computation, see `_check_batch`) must
        # match the mode, which only compute's mention_matrix decides.
        first = next(((q, r[0]) for q, r in enumerate(retrieved) if len(r)), None)
        if mention_matrix is None:
            if first is not None and not isinstance(first[1], str):
                q, item = first
                raise ValueError(
                    f"retrieved[{q}] (query {q}) holds {item!r}, not a caption text; gallery "
                    "indices need mention_matrix= (and class_names=)"
                )
            if class_names is not None:
                raise ValueError("class_names only applies together with mention_matrix")
            result = odmap(
                retrieved,
                removed_classes,
                present_classes,
                k_values=k_values,
                require_present=require_present,
                table=table,
            )
        else:
            result = _odmap_of_indices(
                retrieved,
                first,
                (removed_classes, present_classes),
                (mention_matrix, class_names, table),
                k_values=k_values,
                require_present=require_present,
                allow_duplicates=allow_duplicates,
            )
        scores = {**result.as_dict(), "num_queries": result.num_queries}
        if per_class_plot_path is not None:
            per_class = per_class_odmap(result, removed_classes)
            path = plot_per_class(per_class, per_class_plot_path, title="ODmAP@k per removed class")
            scores["per_class"] = {c: {f"ODmAP@{k}": v for k, v in ks.items()} for c, ks in per_class.items()}
            scores["per_class_plot_path"] = str(path)
        return scores


#: How error messages name one item / the items of each kind of ranking.
_KIND = {"texts": ("a caption text", "caption texts"), "indices": ("a gallery index", "gallery indices")}


def _odmap_of_indices(retrieved, first, classes, gallery, *, k_values, require_present, allow_duplicates):
    """ODmAP@k of rankings given as gallery indices: `gallery` is the [gallery x classes]
    mention matrix, its class names (None: the table's) and the table; `first` the first
    ranked item and its query, checked to be an index, not a caption text."""
    removed_classes, present_classes = classes
    mention_matrix, class_names, table = gallery
    shape = getattr(mention_matrix, "shape", None)
    if shape is None or len(shape) != 2:
        raise ValueError(f"mention_matrix must be a 2-D [gallery x classes] array, got shape {shape}")
    if first is not None and isinstance(first[1], str):
        q, item = first
        raise ValueError(
            f"retrieved[{q}] (query {q}) holds {item!r} (a caption text); with "
            "mention_matrix, retrieved holds integer gallery indices (drop "
            "mention_matrix to score caption texts)"
        )
    if class_names is None:
        names = list(ClassMatcher(table).class_names)
    else:
        names = list(class_names)
    if mention_matrix.shape[1] != len(names):
        raise ValueError(
            f"mention_matrix has {mention_matrix.shape[1]} columns but there are {len(names)} class_names"
        )
    column = {c: j for j, c in enumerate(names)}
    removed = _class_matrix(removed_classes, column, "removed_classes")
    present = _class_matrix(present_classes, column, "present_classes")
    try:
        topk = np.asarray(retrieved, dtype=np.int64)
    except ValueError:
        lengths = sorted({len(r) for r in retrieved})
        raise ValueError(
            f"retrieved gallery indices must have the same length per query, got lengths {lengths}"
        ) from None
    if not allow_duplicates:
        _check_no_repeats(topk)
    return odmap_from_topk(
        topk,
        mention_matrix,
        removed,
        present,
        k_values=k_values,
        require_present=require_present,
    )


def _numpy_if_torch(retrieved):
    return retrieved.detach().cpu().numpy() if hasattr(retrieved, "detach") else retrieved


def _reject_compute_only(kwargs, method):
    if kwargs:
        raise ValueError(
            f"{method} takes retrieved, removed_classes and present_classes only; "
            f"pass {', '.join(sorted(kwargs))} to compute()"
        )


def _check_batch(retrieved, removed_classes, present_classes, buffered_kind, single=False):
    """Raise, naming the query, on input that Arrow would cast (float indices) or reject with an
    unrelated error (a bare-string class list), and on rankings mixing caption texts and gallery
    indices; `buffered_kind` is the kind of the rankings already buffered, `single` means the one
    query of evaluate's `add`. Whether the kind fits the mode is `_compute`'s check."""
    for name, value in (
        ("retrieved", retrieved),
        ("removed_classes", removed_classes),
        ("present_classes", present_classes),
    ):
        if value is None:
            raise ValueError(f"{name} is missing: pass one list per query")
        if isinstance(value, str) or not hasattr(value, "__len__"):
            raise ValueError(f"{name} must be a list with one entry per query, got {type(value).__name__}")
    if len(retrieved) == 0:
        raise ValueError("no queries: retrieved is empty (pass one ranking per query)")

    def where(name, q):
        return f"{name} (the added query)" if single else f"{name}[{q}] (query {q})"

    for name, lists in (("removed_classes", removed_classes), ("present_classes", present_classes)):
        for q, classes in enumerate(lists):
            if isinstance(classes, str) or not hasattr(classes, "__iter__"):
                raise ValueError(
                    f"{where(name, q)} must be a list of class names, got "
                    f"{classes!r}; write [{classes!r}] for one class"
                )
            for c in classes:
                if not isinstance(c, str):
                    raise ValueError(f"{where(name, q)} holds {c!r}; class names are strings")
    kind, source = buffered_kind, "the queries buffered before"
    for q, ranking in enumerate(retrieved):
        if isinstance(ranking, str) or not hasattr(ranking, "__iter__"):
            raise ValueError(f"{where('retrieved', q)} must be a list (best first), got {ranking!r}")
        for item in ranking:
            if isinstance(item, str):
                item_kind = "texts"
            elif isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)):
                item_kind = "indices"
                if not _INT64.min <= int(item) <= _INT64.max:  # Arrow's int64 would overflow
                    raise ValueError(
                        f"{where('retrieved', q)} holds {int(item)}; gallery indices "
                        "must fit int64 (-2**63 to 2**63 - 1)"
                    )
            else:
                raise ValueError(
                    f"{where('retrieved', q)} holds {item!r} ({type(item).__name__}); retrieved "
                    "holds caption texts, or integer gallery indices scored with mention_matrix="
                )
            if kind is None:
                kind, source = item_kind, where("retrieved", q)
            elif item_kind != kind:
                raise ValueError(
                    f"{where('retrieved', q)} holds {item!r} ({_KIND[item_kind][0]}), but "
                    f"{_KIND[kind][1]} came first ({source}): one computation scores caption "
                    "texts or gallery indices, not both"
                )
    if kind == "texts":
        ensure_tagger()


def _check_no_repeats(topk):
    # odmap_from_topk counts a repeated index at every position, so a ranking listing one
    # relevant caption k times would reach ODmAP@k 1.0.
    ordered = np.sort(topk, axis=1)
    repeats = ordered[:, 1:] == ordered[:, :-1]
    rows = np.flatnonzero(repeats.any(axis=1))
    if rows.size:
        q = int(rows[0])
        index = int(ordered[q, 1:][repeats[q]][0])
        positions = np.flatnonzero(topk[q] == index)
        raise ValueError(
            f"retrieved[{q}] (query {q}) repeats gallery index {index} (positions "
            f"{int(positions[0])} and {int(positions[1])}; {rows.size} of {len(topk)} rankings "
            "repeat an index): a ranking lists each gallery caption once — deduplicate it "
            "(allow_duplicates=True scores every position as given)"
        )


def _class_matrix(class_lists, column, name):
    out = np.zeros((len(class_lists), len(column)), dtype=bool)
    for q, classes in enumerate(class_lists):
        for c in classes:
            if c not in column:
                raise ValueError(
                    f"{name}[{q}] names class {c!r}, which is not among the mention_matrix columns (class_names)"
                )
            out[q, column[c]] = True
    return out
