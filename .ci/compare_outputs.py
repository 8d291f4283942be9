"""Compare two `make demo` output folders (e.g. before and after a refactor) file by file.

    python .ci/compare_outputs.py OLD/demo_output NEW/demo_output

A file counts as the same when its bytes are equal or, for JSON and text, when they are equal once
what differs by run is masked: times, timings, the git commit, the local Hub's port and paths of
the checkout. Shards, figures, thumbnails and gallery pages must match byte for byte. Exit 1 when a
file differs or exists on one side only.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

# Run-specific: times, memory peaks, git state, the local Hub's port, and what depends on the checkout's folder
# (a gallery page's size, `.parts/` digests of items that name local paths).
VOLATILE = {
    "created_at",
    "counterfactory_git",
    "timings",
    "seconds",
    "total_seconds",
    "hub",
    "first_page_bytes",
    "item_digests",
    "process_s",
    "write_s",
    "peak_rss_bytes",
}
SKIP = ("hf_home", "tiny_models.lock")


def masked(obj):
    if isinstance(obj, dict):
        return {k: ("<masked>" if k in VOLATILE else masked(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [masked(v) for v in obj]
    return re.sub(r"/[^\s\"']*", "<PATH>", obj) if isinstance(obj, str) and "/" in obj else obj


def masked_text(text: str) -> str:
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[^\s\"<]*", "<TIME>", text)
    return re.sub(r"[0-9a-f]{40}", "<SHA>", re.sub(r"/work/[^\s\"')]*", "<PATH>", text))


def same(x: bytes, y: bytes, suffix: str) -> bool:
    if x == y:
        return True
    if suffix == ".json":
        try:
            return masked(json.loads(x)) == masked(json.loads(y))
        except ValueError:
            return False
    if suffix in (".md", ".html", ".js", ".txt"):
        return masked_text(x.decode(errors="replace")) == masked_text(y.decode(errors="replace"))
    return False


def files(root: Path) -> set[Path]:
    return {
        p.relative_to(root) for p in root.rglob("*") if p.is_file() and not str(p.relative_to(root)).startswith(SKIP)
    }


def main(a: Path, b: Path) -> int:
    in_a, in_b = files(a), files(b)
    problems = [f"only in {a}: {p}" for p in sorted(in_a - in_b)]
    problems += [f"only in {b}: {p}" for p in sorted(in_b - in_a)]
    problems += [
        f"differs: {p}" for p in sorted(in_a & in_b) if not same((a / p).read_bytes(), (b / p).read_bytes(), p.suffix)
    ]
    print("\n".join(problems) or f"{len(in_a)} files, all the same")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
