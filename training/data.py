"""Batches: the pair-aware batch sampler and the DataLoader that decodes parquet image bytes.

The sampler cuts the *global* batch first and only then hands each process its slice, so the
rows of a global batch and their order do not depend on the process count (1 and N processes
see the same loss). With `--hard-negatives pairs` the shuffled groups are packed into units of
two rows (a pair, or two single rows) and every process's slice is a whole number of units, so
both members of a pair land in the same batch on the same process. The order is a function of
(seed, epoch) only, and a resumed run starts an epoch at a given batch.

The last, incomplete batch of an epoch is dropped by default (open_clip_train's `drop_last=True`:
every step sees the whole --batch-size of negatives), so an epoch is floor(N / B) batches;
`--last-batch keep` (the `le2023` recipe: Hugging Face's Trainer behind run_clip.py keeps it,
`dataloader_drop_last=False`) trains it too, ceil(N / B) batches. Kept, it is split over the
processes in whole units as evenly as possible; one with fewer units than processes is still
dropped (a process would have no row).

Images are decoded in the DataLoader workers from the bytes stored in the parquet at full size,
in their own mode (the backend's steps convert to RGB where its reference does: transparency,
palette and CMYK images otherwise differ from it), resized and cropped there to uint8 by the
backend's reference steps; the consuming process
normalises each batch at once (training/backends.py `PixelPipeline`). `--fast-decode` (training
only) decodes JPEGs in PIL's draft mode, at the smallest DCT scale still >= the model's input
size: most of a full-size decode's time, but the pixels then differ from the reference processor
(by 1.6 to 4.7 grey levels on
average on 640x480 test photos, benchmarks/training.py), so evaluation never uses it.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from builders.engine.errors import UserFacingError
from training.mixtures import ExampleSet


class BatchConfigError(UserFacingError, ValueError):
    """The batch size does not fit the process count or the pair size."""


class PairBatchSampler:
    """Local batches of example indices for one process; see the module docstring."""

    def __init__(
        self,
        groups: list[list[int]],
        batch_size: int,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
        keep_pairs: bool = False,
        keep_last: bool = False,
    ) -> None:
        self.unit = 2 if keep_pairs else 1
        self.keep_last = keep_last
        if batch_size % num_replicas:
            raise BatchConfigError(
                f"--batch-size {batch_size} is the global batch and must divide evenly over {num_replicas} processes"
            )
        local = batch_size // num_replicas
        if keep_pairs and local < 2:
            raise BatchConfigError(
                f"--hard-negatives pairs needs at least 2 rows per process batch "
                f"(a pair), but --batch-size {batch_size} over {num_replicas} "
                f"process(es) gives {local}; raise --batch-size"
            )
        if local % self.unit:
            raise BatchConfigError(
                f"--hard-negatives pairs needs an even per-process batch, got "
                f"{local} (--batch-size {batch_size} / {num_replicas} processes)"
            )
        if max((len(g) for g in groups), default=1) > self.unit:
            raise BatchConfigError(
                f"a group of {max(len(g) for g in groups)} rows cannot share a batch unit of {self.unit}"
            )
        self.groups = groups
        self.batch_size, self.local = batch_size, local
        self.num_replicas, self.rank, self.seed = num_replicas, rank, seed
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Iterate epoch `epoch` from its batch `start` (for resuming mid-epoch)."""
        self.epoch, self.start = epoch, start

    def global_batches(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.groups))
        units: list[list[int]] = []
        single: list[int] = []
        for g in order.tolist():
            group = self.groups[g]
            if len(group) == self.unit:
                units.append(list(group))
            else:  # two single rows make a unit (unit 2); a lone last one is dropped
                single += group
                if len(single) == self.unit:
                    units.append(single)
                    single = []
        per_batch = self.batch_size // self.unit
        return [[i for u in units[b : b + per_batch] for i in u] for b in range(0, len(units), per_batch)][: len(self)]

    def __len__(self) -> int:
        n_units = sum(len(g) == self.unit for g in self.groups)
        n_units += sum(len(g) for g in self.groups if len(g) != self.unit) // self.unit
        full, rest = divmod(n_units, self.batch_size // self.unit)
        return full + int(self.keep_last and rest >= self.num_replicas)

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.global_batches(self.epoch)[self.start :]:
            # Whole units, as evenly as the batch allows: a full batch gives each process `local`
            # rows; the kept last one fewer.
            units, n = len(batch) // self.unit, self.num_replicas
            lo, hi = self.rank * units // n, (self.rank + 1) * units // n
            yield batch[lo * self.unit : hi * self.unit]


def decode_image(
    data: bytes, transform: Callable[[Image.Image], torch.Tensor], min_side: int, fast_decode: bool = False
) -> torch.Tensor:
    """The image in its own mode through `transform`, the backend's steps, which convert it to
    RGB where the backend's reference does (training/backends.py)."""
    img = Image.open(io.BytesIO(data))
    if fast_decode and img.format == "JPEG":
        img.draft("RGB", (min_side, min_side))
    return transform(img)


#: The image columns of our builds, numbered for `image_key`.
_IMAGE_COLUMNS = {"image": 0, "image_0": 1, "image_1": 2}


def image_key(examples: ExampleSet, i: int) -> int:
    """One number per stored image (table, row, column): examples showing the same image (COCO's
    five captions of it) share it, as BLIP's `idx` (training/itm_objectives.py)."""
    return (examples.table_of[i] << 48) | (examples.row[i] << 4) | _IMAGE_COLUMNS.get(examples.column[i], 15)


class ExampleDataset(torch.utils.data.Dataset):
    """Example index -> (pixels, caption, negative caption or None, `image_key`).

    The DataLoader asks for a whole batch (`__getitems__`), and the batch's image bytes are read
    with one Arrow gather per (table, column), never a `Dataset.__getitem__` per row (each costs
    a query and a formatter; benchmarks/trainer_startup.py). The workers are forked: they share
    the memory-mapped tables, and a gather copies only its batch's bytes."""

    def __init__(self, examples: ExampleSet, transform, min_side: int, fast_decode: bool = False) -> None:
        self.examples, self.transform, self.min_side = examples, transform, min_side
        self.fast_decode = fast_decode
        # One Arrow view per (table, column), opened in the process that reads it: a gather
        # then touches only that column's bytes.
        self._views: dict[tuple[int, str], object] = {}

    def __len__(self) -> int:
        return len(self.examples)

    def image_bytes(self, indices: list[int]) -> list[bytes]:
        """The stored bytes of examples `indices`' images, in that order."""
        import pyarrow.compute as pc

        ex = self.examples
        at: dict[tuple[int, str], list[int]] = {}
        for j, i in enumerate(indices):
            at.setdefault((ex.table_of[i], ex.column[i]), []).append(j)
        out: list[bytes] = [b""] * len(indices)
        for key, positions in at.items():
            if key not in self._views:
                self._views[key] = ex.tables[key[0]].select_columns([key[1]]).with_format("arrow")
            # A list key is one gather (datasets maps it through a select()'s indices).
            cells = self._views[key][[ex.row[indices[j]] for j in positions]][key[1]]
            for j, data in zip(positions, pc.struct_field(cells, "bytes").to_pylist(), strict=True):
                out[j] = data
        return out

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, str, str | None, int]]:
        ex = self.examples
        return [
            (
                decode_image(data, self.transform, self.min_side, self.fast_decode),
                ex.caption[i],
                ex.negative[i],
                image_key(ex, i),
            )
            for i, data in zip(indices, self.image_bytes(indices), strict=True)
        ]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str, str | None, int]:
        return self.__getitems__([i])[0]


@dataclass
class Collate:
    """Stacks the uint8 pixels and tokenizes captions (in the worker). Negatives: tokens + a mask
    saying which rows have one. `image_key`: which rows show the same image."""

    tokenize: Callable[[list[str]], dict[str, torch.Tensor]]
    negatives: bool = False

    def __call__(self, items):
        pixels, captions, negs, keys = zip(*items, strict=True)
        batch = {
            "pixel_values": torch.stack(pixels),
            "text": self.tokenize(list(captions)),
            "image_key": torch.tensor(keys, dtype=torch.int64),
        }
        if self.negatives:
            batch["negative_text"] = self.tokenize([n or "" for n in negs])
            batch["negative_mask"] = torch.tensor([n is not None for n in negs])
        return batch


class Batches:
    """The DataLoader's batches with pixels normalised in the consuming process: the workers ship
    uint8 (a quarter of float32's bytes; shipping floats halved the 2-worker throughput in
    benchmarks/training.py)."""

    def __init__(self, loader: torch.utils.data.DataLoader, per_batch) -> None:
        self.loader, self.per_batch = loader, per_batch

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            batch["pixel_values"] = self.per_batch(batch["pixel_values"])
            yield batch


def make_loader(
    examples: ExampleSet,
    sampler,
    backend,
    num_workers: int,
    negatives: bool = False,
    fast_decode: bool = False,
    pixels=None,
) -> Batches:
    """Batches of `examples` through `pixels` (default the backend's evaluation pipeline; the
    training loader's with --augment, `Backend.train_pixels`)."""
    pixels = pixels or backend.pixels
    dataset = ExampleDataset(examples, pixels.per_image(), pixels.size, fast_decode)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=Collate(backend.tokenize, negatives),
        persistent_workers=False,
        multiprocessing_context="fork" if num_workers else None,
    )
    return Batches(loader, pixels.per_batch)


def to_device(batch: dict, device) -> dict:
    """The batch's tensors (the tokenizer's dicts too) on `device`, the model's: the loader
    yields CPU tensors and the forward must get them where the weights are. A no-op on CPU."""
    return {
        k: to_device(v, device) if isinstance(v, dict) else v.to(device) if isinstance(v, torch.Tensor) else v
        for k, v in batch.items()
    }


def fixed_batches(n: int, batch_size: int) -> list[list[int]]:
    """In-order batches (evaluation, validation)."""
    return [list(range(b, min(b + batch_size, n))) for b in range(0, n, batch_size)]
