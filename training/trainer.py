"""The training loop, as its parts: `setup` (every input check, before the first step) ->
`train_one_epoch` (steps, logs, step-interval evaluation and checkpoints) -> per epoch `evaluate`
and a checkpoint -> `finish` (final model, card, results); `evaluate_only` for --eval-only.

Everything that can be wrong with the input (options, datasets, revisions, mixture sizes, batch
vs pair size) is checked before the first step. Every process computes the loss of the whole
global batch (training/losses.py), so the loss curve does not depend on the process count.
Evaluation runs on the main process while the others wait.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from builders.engine.errors import OutputError, UserFacingError
from builders.engine.sharding.layout import OutputLayout
from builders.engine.sharding.output_guard import output_lock
from builders.models.clip_ids import OPEN_CLIP, ClipId
from builders.models.pickled_weights import trusting_pickled_weights
from training.accumulation import accumulate_gradients
from training.before_after import BEFORE_EMBEDDINGS, final_statistics, write_before
from training.accelerator_setup import check_mixed_precision, make_accelerator
from training.checkpoint import (
    TrainerState,
    check_resume_step,
    find_checkpoint,
    load_checkpoint,
    push_to_hub,
    save_checkpoint,
    model_card,
)
from training.checkpoint_files import Resumable
from training.augmentation import parse_aug_cfg
from training.config import TrainConfig, as_dict, training_fingerprint
from training.cross_training import cross_encoder_step, load_training_backend, resolve_objective, step_seed
from training.data import Batches, PairBatchSampler, make_loader, to_device
from training.eval_config import EvalConfig
from training.eval_data import EvalData, load_eval_data
from training.evaluation import evaluate_model
from training.final_files import MANIFEST, STAGING, check_before_training, copy_saved_model, fresh_staging, install
from training.leakage import check_eval_overlap
from training.mixtures import build_mixture, eval_only_sets
from training.optimization import clamp_logit_scale, make_optimizer
from training.run_folder import check_run_folder, clear_run_folder, recorded_logs
from training.run_records import published_record, read_jsonl, write_jsonl, write_results
from training.run_root import RunRoot
from training.zeroshot import prompt_sources, skip_counts

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _output_lock(accelerator, output: Path):
    """One run per --output at a time, as one build per folder (the builders' lock, held by the
    main process): a second run would interleave checkpoints and overwrite the results."""
    if not accelerator.is_main_process:
        yield
        return
    with output_lock(OutputLayout(output)):
        yield


def lr_lambda(cfg: TrainConfig, steps_per_epoch: int, total_steps: int):
    o = cfg.optim

    def factor(step: int) -> float:
        warm = min(1.0, (step + 1) / o.warmup_steps) if o.warmup_steps else 1.0
        if o.schedule == "cosine":
            progress = min(1.0, max(0, step - o.warmup_steps) / max(1, total_steps - o.warmup_steps))
            return warm * 0.5 * (1 + math.cos(math.pi * progress))
        if o.schedule == "linear":  # transformers' get_linear_schedule_with_warmup
            if step < o.warmup_steps:
                return warm
            return max(0.0, (total_steps - step) / max(1, total_steps - o.warmup_steps))
        if o.schedule == "step":
            # floor(step / (steps per epoch x --step-epochs)): whole epochs, or a part of one (0.5).
            return warm * o.step_gamma ** math.floor(step / (max(1, steps_per_epoch) * o.step_epochs))
        return warm

    return factor


@dataclass
class Session:
    """What the loop, the evaluation and the finish of one training run share (`setup` makes it)."""

    cfg: TrainConfig
    output: Path
    #: The run folder opened once: every write below it (training/run_root.py).
    root: RunRoot
    accelerator: Any
    backend: Any
    record: dict
    data: EvalData
    #: What `data` is scored with (from `cfg`, its loss resolved).
    evaluation: EvalConfig
    sampler: PairBatchSampler
    loader: Any
    model: Any
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    steps_per_epoch: int
    total: int
    state: TrainerState
    #: loss.jsonl and metrics.jsonl rows (up to the resumed step).
    history: list[dict]
    evals: list[dict]
    bar: Any
    #: The model evaluated and saved (the best checkpoint's at the finish with --best-by-val-loss).
    unwrapped: Any


def run(cfg: TrainConfig) -> dict[str, float]:
    """Train (or only evaluate) as `cfg` says; returns the final metrics."""
    # The device accelerate will pick (make_accelerator), checked before anything is written.
    check_mixed_precision(cfg.optim.mixed_precision, "cuda" if torch.cuda.is_available() else "cpu")
    output = Path(cfg.run.output)
    _make_output(output)
    with RunRoot(output) as root:  # the one way the run writes below --output (#49)
        # A link in --output, a finished or another run there, a --resume of another
        # configuration (every process checks, before any writes: training/run_folder.py).
        check_run_folder(cfg, root, run_fingerprint(cfg, output))
        if cfg.run.push_to_hub:  # a final/ holding files no run wrote would be refused after training
            check_before_training(output)
        accelerator = make_accelerator(cfg, output)
        accelerator.wait_for_everyone()  # every process checked the folder before the main one writes
        with (
            _output_lock(accelerator, output),
            trusting_pickled_weights(cfg.run.trust_pickled_weights),
            recorded_logs(accelerator, root),  # ends the trackers, and records their files
        ):
            return _locked_run(cfg, accelerator, root)


def run_fingerprint(cfg: TrainConfig, output: Path) -> dict:
    """What a checkpoint records of the configuration (training/config.py `training_fingerprint`),
    with local folders named by content as run.json names them: a moved folder is the same one."""
    return training_fingerprint(published_record({"config": as_dict(cfg)}, cfg, output)["config"])


def _make_output(output: Path) -> None:
    if output.exists() and not output.is_dir():
        raise OutputError(f"--output {output} is a file, not a folder; give a new folder or an earlier run's folder")
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(
            f"--output {output}: cannot create the folder ({err.strerror or err}); give a folder you can write"
        ) from None


def _locked_run(cfg: TrainConfig, accelerator, root: RunRoot) -> dict[str, float]:
    """`run` while holding the output folder's lock."""
    if cfg.run.overwrite_output_dir and accelerator.is_main_process:
        clear_run_folder(root)
    accelerator.wait_for_everyone()
    if accelerator.log_with:  # after the lock: a refused run writes nothing under --output
        accelerator.init_trackers("finetune_clip")
    torch.manual_seed(cfg.run.seed)
    random.seed(cfg.run.seed)  # open_clip's colour jitter (--augment) draws from `random`
    # CLIP / open_clip, or the family its config.json names (BLIP, BridgeTower; ViLT, FLAVA scored only).
    backend = load_training_backend(cfg.run.clip_id(), cfg.run.backend, cfg.run)
    # The loss the model was trained with (a SigLIP model's sigmoid loss; a cross-encoder's own
    # objective, its terms' weights recorded), named in run.json.
    objective = resolve_objective(cfg, backend)
    backend.freeze(cfg.optim.lock_image, cfg.optim.lock_text)
    if cfg.optim.grad_checkpointing:
        backend.enable_grad_checkpointing()
    record = {"config": as_dict(cfg), "processes": accelerator.num_processes, "tables": [], **objective}
    if cfg.run.eval_only:
        return evaluate_only(cfg, accelerator, backend, record, root)

    s = setup(cfg, accelerator, backend, record, root)
    if s.state.step == 0:  # a resumed run has its base model's numbers in before.json
        evaluate_base(s)
    while s.state.step < s.total and s.state.epoch < cfg.optim.epochs:
        train_one_epoch(s)
        if s.state.batch >= s.steps_per_epoch * cfg.optim.grad_accum:
            s.state.epoch, s.state.batch = s.state.epoch + 1, 0
            if not cfg.run.eval_every:  # per-epoch evaluation unless a step interval is given
                evaluate(s)
            save_checkpoint(accelerator, root, s.state, _resumable(s), cfg.run.keep_checkpoints)
    s.bar.close()
    return finish(s)


def evaluate_only(cfg: TrainConfig, accelerator, backend, record: dict, root: RunRoot) -> dict[str, float]:
    """`--eval-only`: the final evaluation of the loaded model, no training."""
    output = root.root
    evaluation = EvalConfig.of(cfg)
    held = eval_only_sets(cfg.data)
    data = load_eval_data(evaluation, held.heldout_cf, held.train.tables, held.validation)
    record.update(
        tables=[asdict(r) for r in held.records + data.records],
        skipped=skip_counts(data.zeroshot),
        zeroshot_prompts=prompt_sources(data.zeroshot),
    )
    metrics = {}
    if accelerator.is_main_process:
        backend.module.to(accelerator.device)
        units: dict = {}
        with root.writing("embeddings.npz") as saved:
            metrics = evaluate_model(backend.module, backend, data, evaluation, saved, units)
        _log_metrics(accelerator, "final", metrics, 0)
        record.update(final_statistics(output, data, cfg, metrics, units, trained=False))
        write_results(root, published_record(record, cfg, output), [{"step": 0, "final": True, **metrics}], metrics)
    accelerator.wait_for_everyone()
    return metrics


def setup(cfg: TrainConfig, accelerator, backend, record: dict, root: RunRoot) -> Session:
    """Data, batches, evaluation sets, optimizer and schedule, and the resumed state; every input
    error is raised here, before the first step. Writes the run record (run.json)."""
    output = root.root
    # The checkpoint folder is checked before anything is written (its contents are read below).
    found = find_checkpoint(output, cfg.run.resume, fp16=accelerator.scaler is not None) if cfg.run.resume else None
    mixture = build_mixture(cfg.data)
    sampler, steps_per_epoch, total = _schedule(cfg, mixture.train, accelerator)
    check_resume_step(found, total, steps_per_epoch, cfg.optim.grad_accum)
    evaluation = EvalConfig.of(cfg)
    data = load_eval_data(evaluation, mixture.heldout_cf, mixture.train.tables, mixture.validation)
    # The validation loss picks the final model with --best-by-val-loss: then it is data the
    # model is selected on, checked as the training data is.
    record["eval_overlap"] = check_eval_overlap(
        mixture.train,
        data,
        cfg.run.allow_eval_overlap,
        negatives=cfg.data.hard_negatives == "negclip",
        selection=mixture.validation if cfg.run.best_by_val_loss else None,
    )
    record.update(_data_record(mixture, data), steps=total, steps_per_epoch=steps_per_epoch)
    if accelerator.is_main_process:
        root.write_text("run.json", json.dumps(published_record(record, cfg, output), indent=1))
    loader = _train_loader(cfg, mixture.train, sampler, backend)
    model, optimizer, scheduler = _optimizer_and_schedule(cfg, accelerator, backend, steps_per_epoch, total)
    state = _resumed_state(cfg, accelerator, output, found, model, optimizer, scheduler)
    bar = tqdm(
        total=total, initial=state.step, desc="train", unit="step", disable=not accelerator.is_local_main_process
    )
    return Session(
        cfg,
        output,
        root,
        accelerator,
        backend,
        record,
        data,
        evaluation,
        sampler,
        loader,
        model,
        optimizer,
        scheduler,
        steps_per_epoch,
        total,
        state,
        history=read_jsonl(output / "loss.jsonl", state.step),
        evals=read_jsonl(output / "metrics.jsonl", state.step),
        bar=bar,
        unwrapped=accelerator.unwrap_model(model),
    )


def _data_record(mixture, data: EvalData) -> dict[str, Any]:
    """What the run read and counted, for run.json: every table, the examples per role, the skips
    and the zero-shot prompts."""
    return dict(
        tables=[asdict(r) for r in mixture.records + data.records],
        train_examples=mixture.train.counts(),
        validation_examples=mixture.validation.counts() if mixture.validation else {},
        test_examples=mixture.test.counts() if mixture.test else {},
        skipped={**mixture.skipped, **skip_counts(data.zeroshot)},
        zeroshot_prompts=prompt_sources(data.zeroshot),
    )


def _schedule(cfg: TrainConfig, train, accelerator) -> tuple[PairBatchSampler, int, int]:
    """The batch sampler of this process, the optimizer steps per epoch and the steps in all."""
    keep_pairs = cfg.data.hard_negatives == "pairs"
    groups = train.groups() if keep_pairs else [[i] for i in range(len(train))]
    sampler = PairBatchSampler(
        groups,
        cfg.optim.batch_size,
        accelerator.num_processes,
        accelerator.process_index,
        cfg.run.seed,
        keep_pairs,
        keep_last=cfg.optim.last_batch == "keep",
    )
    # --last-batch keep: as Hugging Face's Trainer, the last step takes the batches left over.
    accum = cfg.optim.grad_accum
    steps_per_epoch = -(-len(sampler) // accum) if cfg.optim.last_batch == "keep" else len(sampler) // accum
    if steps_per_epoch == 0:
        raise UserFacingError(
            f"{len(train)} training examples make no full step of "
            f"--batch-size {cfg.optim.batch_size} x --grad-accum "
            f"{cfg.optim.grad_accum}; lower them or add data"
        )
    total = steps_per_epoch * cfg.optim.epochs
    if cfg.optim.max_steps is not None:
        total = min(total, cfg.optim.max_steps)
    return sampler, steps_per_epoch, total


def _train_loader(cfg: TrainConfig, train, sampler: PairBatchSampler, backend) -> Batches:
    """The training batches of this process (`sampler`'s), through the backend's training pixel
    pipeline with --augment and its evaluation one otherwise."""
    train_pixels = backend.train_pixels(parse_aug_cfg(cfg.data.aug_cfg)) if cfg.data.augment else None
    return make_loader(
        train,
        sampler,
        backend,
        cfg.data.num_workers,
        negatives=cfg.data.hard_negatives == "negclip",
        fast_decode=cfg.data.fast_decode,
        pixels=train_pixels,
    )


def _optimizer_and_schedule(
    cfg: TrainConfig, accelerator, backend, steps_per_epoch: int, total: int
) -> tuple[Any, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The model and its optimizer, prepared by accelerate, and the learning-rate schedule (not
    prepared): what each optimizer step updates."""
    o = cfg.optim
    optimizer = make_optimizer(
        backend.module,
        o.optimizer,
        o.lr,
        o.weight_decay,
        (o.beta1, o.beta2),
        o.eps,
        one_dimensional=cfg.run.backend == "open_clip",
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, steps_per_epoch, total))
    # The scheduler is not prepared: accelerate would step it once per process per step. Nor
    # registered for accelerate's checkpoints: those pickle it, and unpickle it on --resume with
    # weights_only=False; training/checkpoint_files.py saves it as JSON.
    model, optimizer = accelerator.prepare(backend.module, optimizer)
    return model, optimizer, scheduler


def _resumed_state(
    cfg: TrainConfig, accelerator, output: Path, found: Path | None, model, optimizer, scheduler
) -> TrainerState:
    """The trainer's counters: a new run's, or those of --resume's checkpoint `found` (which
    restores the model, optimizer, schedule and loss scaler too); with the configuration's
    fingerprint, which every checkpoint records."""
    state = TrainerState()
    if found is not None:
        state = load_checkpoint(
            accelerator, found, Resumable(accelerator.unwrap_model(model), optimizer, scheduler, accelerator.scaler)
        )
        log.info("resumed from %s (epoch %d, batch %d, step %d)", found, state.epoch, state.batch, state.step)
    state.config = run_fingerprint(cfg, output)  # recorded in every checkpoint
    return state


def train_one_epoch(s: Session) -> None:
    """The optimizer steps left in the current epoch (all of them unless resumed mid-epoch or
    stopped by --max-steps), with the step-interval logging, evaluation and checkpoints."""
    cfg, state, accum = s.cfg, s.state, s.cfg.optim.grad_accum
    s.sampler.set_epoch(state.epoch, state.batch)
    batches = iter(s.loader)
    for _ in range(state.batch // accum, s.steps_per_epoch):
        if state.step >= s.total:
            break
        terms = _accumulate_gradients(s, batches)
        if cfg.optim.max_grad_norm is not None:
            s.accelerator.clip_grad_norm_(s.model.parameters(), cfg.optim.max_grad_norm)
        s.optimizer.step()
        clamp_logit_scale(s.unwrapped)
        s.optimizer.zero_grad(set_to_none=True)
        lr = s.scheduler.get_last_lr()[0]
        s.scheduler.step()
        state.step += 1
        state.batch += accum
        s.bar.update(1)
        if state.step % cfg.run.log_every == 0 or state.step == s.total:
            s.history.append({"step": state.step, "epoch": state.epoch, **terms, "lr": lr})
            s.accelerator.log({**terms, "lr": lr}, step=state.step)
            if s.accelerator.is_main_process:
                write_jsonl(s.root, "loss.jsonl", s.history)
            s.bar.set_postfix(loss=f"{terms['loss']:.4f}")
        if cfg.run.eval_every and state.step % cfg.run.eval_every == 0:
            evaluate(s)
        if cfg.run.save_every and state.step % cfg.run.save_every == 0:
            save_checkpoint(s.accelerator, s.root, state, _resumable(s), cfg.run.keep_checkpoints)


def _resumable(s: Session) -> Resumable:
    """What a checkpoint saves besides `s.state` (the training model, not the best one)."""
    return Resumable(s.accelerator.unwrap_model(s.model), s.optimizer, s.scheduler, s.accelerator.scaler)


def _accumulate_gradients(s: Session, batches) -> dict[str, float]:
    """Forward and backward over --grad-accum batches of one optimizer step, as one contrastive
    batch (training/accumulation.py); its loss (and a cross-encoder's terms: one batch, its
    negatives drawn with the step's own seed)."""
    # An explicit move, not a prepared loader: preparing it would re-shard the batches that
    # PairBatchSampler already cut per process (pairs kept together, 1 and N processes equal).
    # Fewer only at the last step of an epoch with --last-batch keep (the batches left over).
    micro = [to_device(b, s.accelerator.device) for b in itertools.islice(batches, s.cfg.optim.grad_accum)]
    if not s.backend.dual_encoder:
        seed = step_seed(s.cfg.run.seed, s.state.step, s.accelerator.process_index)
        return cross_encoder_step(s.model, micro[0], s.accelerator, s.backend, seed)
    return {"loss": accumulate_gradients(s.model, micro, s.accelerator, s.cfg.optim.loss)}


def evaluate_base(s: Session) -> None:
    """The base model on every configured evaluation before step 1 (`before.json`), its
    embeddings saved for the before -> after intervals (training/before_after.py). The RNG is
    forked: the training that follows is the one it would be without this evaluation."""
    if s.accelerator.is_main_process:
        # fork_rng: a DataLoader iterator draws its base seed.
        with torch.random.fork_rng(devices=[]), s.root.writing(BEFORE_EMBEDDINGS) as saved:
            write_before(s.root, evaluate_model(s.unwrapped, s.backend, s.data, s.evaluation, saved))
    s.accelerator.wait_for_everyone()


def evaluate(s: Session, final: bool = False, units: dict | None = None) -> dict[str, float]:
    """Our metrics on the main process (the others wait), appended to metrics.jsonl; keeps the
    best model by validation loss with --best-by-val-loss. The final one saves the embeddings
    (and fills `units` with the per-unit scores of its intervals)."""
    cfg, state = s.cfg, s.state
    metrics: dict[str, float] = {}
    if s.accelerator.is_main_process:
        with s.root.writing("embeddings.npz") if final else contextlib.nullcontext() as saved:
            metrics = evaluate_model(s.unwrapped, s.backend, s.data, s.evaluation, saved, units)
        s.evals.append({"step": state.step, "epoch": state.epoch, "final": final, **metrics})
        write_jsonl(s.root, "metrics.jsonl", s.evals)
        _log_metrics(s.accelerator, "final" if final else "eval", metrics, state.step)
        val = metrics.get("val_loss")
        if (
            cfg.run.best_by_val_loss
            and val is not None
            and not final
            and (state.best_val_loss is None or val < state.best_val_loss)
        ):
            state.best_val_loss = val
            with s.root.at("best") as best:
                s.backend.save(s.unwrapped, best)
    s.accelerator.wait_for_everyone()
    return metrics


def finish(s: Session) -> dict[str, float]:
    """The final model (the last, or the best by validation loss) with its card, the final
    evaluation, the results files, and the push to the Hub; returns the final metrics. The model
    and card are written to a fresh folder and then moved into final/, which records them
    (training/final_files.py): the push sends only those files."""
    cfg, output, accelerator = s.cfg, s.output, s.accelerator
    staged = None
    if accelerator.is_main_process:
        staged = fresh_staging(s.root)
        if cfg.run.best_by_val_loss and (output / "best").is_dir():
            copy_saved_model(s.root, "best", STAGING)
            best = load_training_backend(_saved_model(s.backend, staged)).module
            # A cross-encoder scores through its backend's module: the best one too.
            s.unwrapped = s.backend.module = best.to(accelerator.device)
        else:
            with s.root.at(STAGING) as folder:
                s.backend.save(s.unwrapped, folder)
    units: dict = {}
    metrics = evaluate(s, final=True, units=units)
    if accelerator.is_main_process:
        s.record.update(final_statistics(output, s.data, cfg, metrics, units))
        s.root.write_text(f"{STAGING}/README.md", model_card(published_record(s.record, cfg, output), metrics))
        install(s.root)
        write_results(s.root, published_record(s.record, cfg, output), s.evals, metrics)
        if cfg.run.push_to_hub:
            push_to_hub(output / "final", cfg.run.push_to_hub, output / MANIFEST)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return metrics


def _log_metrics(accelerator, prefix: str, metrics: dict[str, float], step: int) -> None:
    """The evaluation's metrics to the trackers (`--report-to`) as `eval/NAME` (in the loop) or
    `final/NAME` (the final model), beside the loss and lr."""
    accelerator.log({f"{prefix}/{name}": value for name, value in metrics.items()}, step=step)


def _saved_model(backend, folder: Path) -> ClipId:
    """The model `backend.save` wrote to `folder`, in its backend's format."""
    if backend.kind == OPEN_CLIP:
        return ClipId(OPEN_CLIP, str(folder), f"local-dir:{folder}")
    return ClipId(backend.kind, str(folder), str(folder))
