"""CLIP finetuning on the project's datasets: `counterfactory train ...`, or on N processes
`accelerate launch training/finetune_clip.py ...` (the same code and flags).

Module map: config (typed run configuration, each field with its flag's help; recipes) -> options
(the parsers, generated from config) -> sources (datasets by repo id + revision or build folder)
-> mixtures (D, D ∪ D'_sub, cf:real|base|medium|all) -> data (pair-aware batch sampler, workers
decoding parquet bytes) -> backends (transformers / open_clip CLIP) -> losses (InfoNCE, NegCLIP)
-> optimization (no-decay group, logit-scale clamp) -> trainer (setup -> train_one_epoch ->
evaluate -> finish) -> evaluation (our metrics) -> leakage (training or selection data in evaluation sets:
images by id and bytes, captions) -> checkpoint (resume, final model + card, push) -> run_folder
(no run overwritten or continued by another) ; finetune_clip (the entry point) ; sweep (seeds +
Welch t-test, `counterfactory sweep`).
"""
