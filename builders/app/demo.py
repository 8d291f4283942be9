"""`make demo`: the whole pipeline end to end on the embedded fixture, offline, in a few minutes.

fixture COCO -> offline NLTK tagger -> tiny models -> every builder (sharded, resumable) ->
a local Hub on 127.0.0.1 -> publish each build as v1.0.0 -> `load_dataset(repo, revision=...)`
-> publish the metric modules as Spaces -> `evaluate.load(...)` -> metrics on the loaded data
-> a 5-step `accelerate launch training/finetune_clip.py` on the builds -> `counterfactory
benchmark` of the base and the finetuned model beside a tiny BLIP ITM cross-encoder; it ends with the paths of the run's metrics.md
and the report's report.md.

The same commands work against the real Hub: drop `--endpoint`, set HF_TOKEN, use `--models
production`. Everything lands in `--workdir` (default demo_output/) and a summary JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from builders.engine.option_types import number

log = logging.getLogger("counterfactory.demo")


@dataclass
class DemoBuild:
    """A builder run of the demo: `counterfactory build NAME ARGS --output OUT`."""

    name: str
    args: list[str]
    #: Configs/splits to check after loading from the Hub.
    check: list[tuple[str, str]] = field(default_factory=list)
    #: Small parts, so that the fixture's few items still make several parts (resume, sharding).
    part_size: int = 4


def demo_builds(coco: Path, tiny_dir: Path, sim_window: tuple[float, float] | None = None) -> list[DemoBuild]:
    """The builds run by the demo, for every builder registered in `build_cli`. `sim_window`
    replaces the caption stage's similarity window, for a stand-in sentence model."""
    from builders.app.registry import BUILDER_MODULES

    tiny = ["--models", "tiny", "--tiny-models-dir", str(tiny_dir)]
    window = ["--sim-low", str(sim_window[0]), "--sim-high", str(sim_window[1])] if sim_window else []
    known = {
        "coco-captions": DemoBuild(
            "coco-captions",
            # train: what the demo's finetuning run trains on.
            ["--coco-root", str(coco), "--splits", "train", "test", "val"],
            [("default", "test"), ("captions", "test")],
        ),
        # `--models tiny` also picks the tiny sizes (64 px, 2 steps, 4 candidates, no CLIP
        # threshold: builders.models.profiles); the real defaults are the METHOD.md notes'.
        "decorrelation": DemoBuild(
            "decorrelation",
            ["--coco-root", str(coco), *tiny],
            [("default", "train"), ("odmap_queries", "test"), ("odmap_gallery", "test")],
        ),
        "coco-counterfactuals": DemoBuild(
            "coco-counterfactuals",
            ["--coco-root", str(coco), "--karpathy-splits", "test", *tiny, *window],
            [("default", "test"), ("captions", "test")],
        ),
        # Every annotated ECCV query gets a row (30,000 with ids only where the fixture has no
        # such image or caption), so parts are larger.
        "eccv-positives": DemoBuild(
            "eccv-positives",
            ["--coco-root", str(coco)],
            [("i2t", "test"), ("t2i", "test"), ("removed", "test")],
            part_size=2000,
        ),
    }
    return [known[name] for name in BUILDER_MODULES if name in known]


class Demo:
    def __init__(self, workdir: Path, sim_window: tuple[float, float] | None = None) -> None:
        self.workdir = workdir.resolve()
        self.sim_window = sim_window
        self.summary: dict = {"steps": {}}

    def step(self, name: str, fn, *args):
        log.info("== %s", name)
        start = time.perf_counter()
        result = fn(*args)
        seconds = round(time.perf_counter() - start, 2)
        self.summary["steps"][name] = {"seconds": seconds, **(result or {})}
        log.info("   %s done in %.1f s", name, seconds)
        return result

    def run(self) -> dict:
        from builders.app.cli import main as cli

        coco = self.workdir / "coco"
        tiny_dir = self.workdir / "tiny_models"
        nltk_dir = Path(os.environ.get("NLTK_DATA") or self.workdir / "nltk_data")

        def must(argv: list[str]) -> None:
            if cli(argv) != 0:
                raise SystemExit(f"demo step failed: counterfactory {' '.join(argv)}")

        self.step("fixture", lambda: must(["fixture", "coco", str(coco), "--images", "24"]))
        self.step("nltk", lambda: must(["nltk", "offline-tagger", "--nltk-data", str(nltk_dir)]))
        self.step("tiny models", lambda: must(["models", "tiny", str(tiny_dir)]))
        builds = demo_builds(coco, tiny_dir, self.sim_window)
        for b in builds:
            out = self.workdir / "builds" / b.name
            self.step(
                f"build {b.name}",
                lambda b=b, out=out: must(
                    ["build", b.name, *b.args, "--output", str(out), "--part-size", str(b.part_size)]
                ),
            )

        from builders.devtools.local_hub import LocalHub

        with LocalHub(port=int(os.environ["HF_ENDPOINT"].rsplit(":", 1)[1])) as hub:
            self.summary["hub"] = hub.url
            for b in builds:
                self.step(f"publish + load {b.name}", self.publish_and_load, b)
            self.step("publish + load metric odmap", self.metric_roundtrip)
            if any(b.name == "decorrelation" for b in builds):
                self.step("ODmAP@k of tiny CLIP on demo/decorrelation", self.odmap_of_tiny_clip, tiny_dir)
        self.step("gallery", self.galleries, builds)
        self.step("finetune", self.finetune, tiny_dir)
        self.step("benchmark", self.benchmark, tiny_dir)
        return self.summary

    def finetune(self, tiny_dir: Path) -> dict:
        """`accelerate launch training/finetune_clip.py`: 5 steps of the tiny CLIP on the
        coco-captions build's train split, evaluated on its test split and the decorrelation
        build's ODmAP sets, before and after."""
        import subprocess

        repo = Path(__file__).resolve().parents[2]
        builds, out = self.workdir / "builds", self.workdir / "runs" / "finetune"
        argv = [
            str(Path(sys.executable).parent / "accelerate"),
            "launch",
            *("--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"),
            str(repo / "training" / "finetune_clip.py"),
            *("--real", str(builds / "coco-captions"), "--real-train-splits", "train"),
            *("--decorrelation", str(builds / "decorrelation")),
            *("--models", "tiny", "--tiny-models-dir", str(tiny_dir)),
            *("--max-steps", "5", "--batch-size", "4", "--num-workers", "0", "--report-to", "none"),
            *("--output", str(out)),
        ]
        if subprocess.run(argv, check=False).returncode != 0:
            raise SystemExit(f"demo step failed: {' '.join(argv)}")
        return {"run": str(out), "metrics": str(out / "metrics.md"), "model": str(out / "final")}

    def benchmark(self, tiny_dir: Path) -> dict:
        """`counterfactory benchmark` of the base tiny CLIP, the demo's finetuned one and a tiny
        cross-encoder (BLIP ITM, built by `models tiny` under families/: its ITM deltas on the
        coco-counterfactuals build, as its paper's G)."""
        from builders.app.cli import main as cli
        from builders.models.profiles import resolve_profile

        builds, out = self.workdir / "builds", self.workdir / "report"
        base, tuned = resolve_profile("tiny", tiny_dir).clip, self.summary["steps"]["finetune"]["model"]
        models = ["--model", base, "--model", tuned, "--model", str(tiny_dir / "families" / "blip")]
        argv = ["benchmark", *models, "--coco", str(builds / "coco-captions")]
        argv += ["--decorrelation", str(builds / "decorrelation")]
        argv += ["--counterfactuals", str(builds / "coco-counterfactuals")]
        argv += ["--num-workers", "0", "--output", str(out)]
        if cli(argv) != 0:
            raise SystemExit(f"demo step failed: counterfactory {' '.join(argv)}")
        return {"report": str(out / "report.md"), "results": str(out / "results.jsonl")}

    def galleries(self, builds: list[DemoBuild]) -> dict:
        """`counterfactory show` of every build, linked from one page to open in a browser."""
        from builders.app.cli import main as cli
        from builders.viewer.render import write_gallery_index

        root = self.workdir / "gallery"
        for b in builds:
            if cli(["show", str(self.workdir / "builds" / b.name), "--output", str(root / b.name)]) != 0:
                raise SystemExit(f"the gallery of {b.name} failed")
        index = write_gallery_index(root, {b.name: root / b.name for b in builds})
        return {"gallery": str(index)}

    def publish_and_load(self, b: DemoBuild) -> dict:
        from datasets import load_dataset

        from builders.app.cli import main as cli

        out = self.workdir / "builds" / b.name
        repo = f"demo/{b.name}"
        if cli(["publish", str(out), "--repo-id", repo, "--version", "v1.0.0"]) != 0:
            raise SystemExit(f"publishing {b.name} failed")
        rows = {}
        for config, split in b.check or [("default", "train")]:
            remote = load_dataset(repo, config, split=split, revision="v1.0.0")
            local = load_dataset(str(out), config, split=split)
            if remote.to_list() != local.to_list():  # images compare as embedded bytes
                raise SystemExit(f"{repo}@v1.0.0 {config}/{split} differs from the local build")
            rows[f"{config}/{split}"] = len(remote)
        log.info("   load_dataset(%r, revision='v1.0.0'): %s", repo, rows)
        return {"repo": repo, "rows": rows}

    def metric_roundtrip(self) -> dict:
        import evaluate

        from builders.app.cli import main as cli

        module_dir = Path(__file__).resolve().parents[2] / "evaluate_modules" / "odmap"
        if cli(["publish-metric", str(module_dir), "--repo-id", "demo/odmap", "--version", "v1.0.0"]) != 0:
            raise SystemExit("publishing the odmap metric failed")
        odmap = evaluate.load("demo/odmap", revision="v1.0.0")
        # Two image queries whose "dog" was removed; captions ranked best first.
        result = odmap.compute(
            retrieved=[
                ["A frisbee in the air.", "Two dogs and a frisbee."],
                ["Two dogs and a frisbee.", "A frisbee on the grass."],
            ],
            removed_classes=[["dog"], ["dog"]],
            present_classes=[["frisbee"], ["frisbee"]],
            k_values=[1, 2],
        )
        log.info("   evaluate.load('demo/odmap', revision='v1.0.0').compute(...) = %s", result)
        # By hand: query 1's top caption is right (no dog, mentions the frisbee), query 2's is not.
        if result["ODmAP@1"] != 0.5:
            raise SystemExit(f"unexpected ODmAP@1 {result['ODmAP@1']} (expected 0.5)")
        return {"odmap_example": result}

    def odmap_of_tiny_clip(self, tiny_dir: Path) -> dict:
        """The dataset card's recipe: a CLIP model -> ODmAP@1/5/10 on the published ODmAP set."""
        import evaluate
        import numpy as np
        import torch
        from datasets import load_dataset

        from counterfactory_metrics.map_at_r.topk import topk_from_embeddings
        from builders.models.clip import features
        from builders.models.loaders import load_clip
        from builders.models.profiles import resolve_profile

        repo = "demo/decorrelation"
        queries = load_dataset(repo, "odmap_queries", split="test", revision="v1.0.0")
        gallery = load_dataset(repo, "odmap_gallery", split="test", revision="v1.0.0")
        manifest = json.loads((self.workdir / "builds" / "decorrelation" / "build_manifest.json").read_text())
        model, processor = load_clip(resolve_profile("tiny", tiny_dir).clip)
        with torch.no_grad():
            images = features(
                model.get_image_features(**processor(images=list(queries["image"]), return_tensors="pt"))
            )
            texts = features(
                model.get_text_features(
                    **processor(text=list(gallery["caption"]), return_tensors="pt", padding=True, truncation=True)
                )
            )
        topk, _ = topk_from_embeddings(images, texts, k=10, normalize=True)
        result = evaluate.load("demo/odmap", revision="v1.0.0").compute(
            retrieved=topk.tolist(),
            removed_classes=list(queries["removed_classes"]),
            present_classes=list(queries["present_classes"]),
            mention_matrix=np.array(gallery["mentions"]),
            class_names=manifest["card_fields"]["class_names"],
        )
        log.info("   tiny (random) CLIP on %d queries x %d captions: %s", len(queries), len(gallery), result)
        return {"odmap_tiny_clip": result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m builders.app.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("demo_output"))
    # A machine without the real all-MiniLM-L6-v2 (the GPU check's random stand-in puts one-word
    # edits near 0.98) keeps no caption pair in the paper's (0.8, 0.91] window.
    parser.add_argument(
        "--sim-window",
        type=number,
        nargs=2,
        metavar=("LOW", "HIGH"),
        help="coco-counterfactuals' caption similarity window (default: the paper's)",
    )
    args = parser.parse_args(argv)
    # The demo talks to its own local Hub; the user's real token is never sent anywhere.
    from builders.devtools.local_hub import free_port  # imports no HF library: they read the env below

    os.environ.update(
        HF_ENDPOINT=f"http://127.0.0.1:{free_port()}",
        HF_HUB_DISABLE_XET="1",
        HF_TOKEN="demo-local-hub",
        HF_HOME=str(args.workdir.resolve() / "hf_home"),
        HF_HUB_DISABLE_TELEMETRY="1",
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "huggingface_hub", "datasets"):  # one line per HTTP request
        logging.getLogger(noisy).setLevel(logging.WARNING)
    start = time.perf_counter()
    summary = Demo(args.workdir, args.sim_window).run()
    summary["total_seconds"] = round(time.perf_counter() - start, 1)
    path = args.workdir / "demo_summary.json"
    path.write_text(json.dumps(summary, indent=2))
    log.info("demo finished in %.0f s; summary in %s", summary["total_seconds"], path)
    print(f"browse the demo builds: open {summary['steps']['gallery']['gallery']}")
    print(f"the finetuning run's metrics: {summary['steps']['finetune']['metrics']}")
    print(f"the model report (base and finetuned CLIP, tiny BLIP ITM): {summary['steps']['benchmark']['report']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
