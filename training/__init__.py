"""CLIP finetuning on the project's datasets: `accelerate launch training/finetune_clip.py ...`.

Module map: config (typed run configuration, recipes, flags) -> sources (datasets by repo id +
revision or build folder) -> mixtures (D, D ∪ D'_sub, cf:base|medium|all) -> data (pair-aware
batch sampler, workers decoding parquet bytes) -> backends (transformers / open_clip CLIP) ->
losses (InfoNCE, NegCLIP) -> trainer (the loop) -> evaluation (our metrics) -> checkpoint
(resume, final model + card, push) ; sweep (seeds + Welch t-test).
"""
