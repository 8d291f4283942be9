"""What a builder provides to the sharded runner.

A builder turns an ordered list of cheap work items (ids, caption records, ...) into rows of one
or more outputs (a `config/split` pair each). The runner cuts the item list into fixed-size parts
that do not depend on the number of processes, so the same config and seed give the same shards
whether the build runs on one process or many, and a crashed build resumes part by part.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, Sequence

import datasets


@dataclass(frozen=True)
class OutputSpec:
    """One published table: a split of a config, with its schema and how its rows are viewed."""

    config: str
    split: str
    features: datasets.Features
    #: `builders.viewer.row_view.RowView.to_dict()`, recorded in the manifest for the gallery and
    #: the card figures (a plain dict: the engine sits below the viewer); None: the generic view.
    view: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        return f"{self.config}/{self.split}"


@dataclass(frozen=True)
class Emit:
    """A finished row for the output `config/split` (see `OutputSpec.key`)."""

    output: str
    row: dict[str, Any]


@dataclass(frozen=True)
class Skip:
    """An item that produced no row, and why.

    `kind="filtered"` is the method working as intended (e.g. a selection rule rejected an
    image); `kind="error"` is bad input (an unreadable image, an empty caption). Errors are
    counted against the run's failure threshold; filtered items are not.
    """

    reason: str
    kind: str = "filtered"
    detail: str = ""


@dataclass(frozen=True)
class Count:
    """A tally that is not an item's outcome (e.g. candidates a filter rejected): summed per
    part into the stats and over the build into the manifest's `counts`."""

    name: str
    n: int = 1


@dataclass
class BuildInfo:
    """Provenance a builder reports for the manifest and the dataset card."""

    builder: str
    card_template: str
    pretty_name: str
    config: dict[str, Any]
    models: dict[str, str] = field(default_factory=dict)
    card_fields: dict[str, Any] = field(default_factory=dict)
    #: Local input files or folders as the command line spelled them (`../data/pairs.tsv`): the
    #: manifest names them as it names local models wherever a value (the command line too) is
    #: one. Not recorded themselves.
    local_inputs: tuple[str, ...] = ()


class ShardedBuilder(Protocol):
    """Implemented by every builder module."""

    def outputs(self) -> Sequence[OutputSpec]:
        """All tables this build writes (each gets a shard set even when empty)."""

    def work_items(self) -> Iterable[Any]:
        """All items, in a deterministic order (cheap records, not pixels). Read once per
        process, which keeps only its own parts (`shares`): a generator never holds the rest."""

    def source_option(self) -> str:
        """The option naming this build's inputs, with its value as given (e.g. `--captions-from
        pairs.tsv`): what a message about the inputs names (none at all, or different copies on
        two machines)."""

    def process(self, items: Sequence[Any]) -> Iterable[Emit | Skip]:
        """Turn one part's items into rows. Called on every process; load models lazily."""

    def info(self) -> BuildInfo:
        """Config, model ids and card fields recorded in the manifest."""
