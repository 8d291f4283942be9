"""Paths inside a build output folder, and the one way to write below it.

    OUT/
      README.md                      dataset card with YAML `configs:` (written by merge)
      build_manifest.json            config, versions, models, seeds, counts (written by merge)
      data/{split}-NNNNN-of-NNNNN.parquet            the `default` config
      data/{config}/{split}-NNNNN-of-NNNNN.parquet   any named config
      figures/*.png                  the card's figures (written by merge)
      .parts/run.json                the run fingerprint; a resume must match it
      .parts/lock                    held by the build that is writing here (see output_guard)
      .parts/worker-NNNNN.lock       held by job-array worker N while it builds its parts
      .parts/{config}/{split}/part-KKKKK.parquet
      .parts/stats/part-KKKKK.json   written last: its presence marks part K finished

The same folder is what `load_dataset(OUT)` reads; `counterfactory publish` uploads the files the
manifest lists, the card and the manifest (see `build_files`), never `.parts/`.

Every write, rename and delete below OUT goes through `OutputLayout.out`, OUT opened once for the
run (`no_follow.RootDir`, issue #49): a folder below it that is, or becomes, a symlink is refused
in one line naming it, and nothing is written or deleted through it. The `Path` properties name
files in messages and for reads (which go through `no_follow.open_no_follow`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from builders.engine.no_follow import RootDir

PARTS_DIR = ".parts"
MANIFEST = "build_manifest.json"


@dataclass
class OutputLayout:
    root: Path
    _out: RootDir | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def out(self) -> RootDir:
        """The output root, opened on first use (made when missing) and kept open for the run."""
        if self._out is None:
            self._out = RootDir(self.root, create=True)
        return self._out

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    def __enter__(self) -> OutputLayout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rel(self, path: Path) -> str:
        """`path` (one of this layout's) relative to the root, as `out` takes it."""
        return path.relative_to(self.root).as_posix()

    @property
    def parts(self) -> Path:
        return self.root / PARTS_DIR

    @property
    def run_file(self) -> Path:
        return self.parts / "run.json"

    @property
    def lock_file(self) -> Path:
        return self.parts / "lock"

    def worker_lock_file(self, worker: int) -> Path:
        return self.parts / f"worker-{worker:05d}.lock"

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def readme(self) -> Path:
        return self.root / "README.md"

    def part_file(self, output_key: str, part: int) -> Path:
        return self.parts / output_key / f"part-{part:05d}.parquet"

    def stats_file(self, part: int) -> Path:
        return self.parts / "stats" / f"part-{part:05d}.json"

    def data_dir(self, config: str) -> str:
        """Folder (relative to root) of a config's shards."""
        return "data" if config == "default" else f"data/{config}"

    def shard_name(self, config: str, split: str, index: int, total: int) -> str:
        return f"{self.data_dir(config)}/{split}-{index:05d}-of-{total:05d}.parquet"
