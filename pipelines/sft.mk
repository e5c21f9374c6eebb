# Agentic SFT (docs/ARCHITECTURE.md, "Training"): the distilled CoA text of every suite -> tokens with loss masks -> the student,
# trained on DEVICE and saved as an HF checkpoint that also resumes exactly.
# The student (SFT_BASE): SIZE=default fine-tunes the pretrained SmolLM2-135M-Instruct (its GGUF,
# `make model`): its own tokenizer and chat template, with the 22 CoA tags added as tokens (their
# embedding rows start at the mean of their text pieces', `<code>` from `<`, `code`, `>`, and learn
# at SFT_NEW_TOKEN_LR_MULT times the rate so the tag parts from the word), every layer trained
# (SFT_FREEZE_LAYERS=20 halves a CPU step but cost most of the accuracy: 15% against 82.5% of
# 40 validation math tasks, README "Fine-tuning a pretrained model"). SIZE=smoke and full
# train a fresh Llama (the SFT_MODEL preset) with a byte-level BPE trained on the CoA text.
#   runs/<RUN>/sft/tokenizer.json            the tokenizer, tags included (HF format)
#   runs/<RUN>/sft/<suite>/tokens.parquet    token ids + loss masks (observations and prompt masked)
#   runs/<RUN>/sft/checkpoint/               config.json, model.safetensors, generation_config.json,
#                                            tokenizer.json, optimizer.safetensors, trainer_state.json
#   runs/<RUN>/sft/metrics.parquet           one row per optimizer step (step, loss, lr, grad_norm, tokens/s)
#   runs/<RUN>/sft/loss.png                  the loss curve
#   runs/<RUN>/tensorboard/sft/              the per-step metrics for `tensorboard --logdir runs/<RUN>/tensorboard`
# The trainer prints the falling loss every few steps; `make sft` then prints the summary table
# (pipelines/sft_report.py).

SFT_BASE         ?= $(call by_size,,$(SMOLLM2_GGUF),)
SFT_MODEL        ?= $(call by_size,tiny,,small)
SFT_VOCAB        ?= $(call by_size,4096,,8192)
SFT_BPE_SUITE    ?= $(firstword $(SUITES))
# Longer sequences are cut at a token boundary outside any observation (coa-tokenize --overlong);
# the default's 4096 cuts none of its rows (multihop's longest is 3,294 tokens).
SFT_MAX_LEN      ?= $(call by_size,2048,4096,3584)
SFT_OVERLONG     ?= truncate
# The run's length: SFT_EPOCHS passes over the data when set, else SFT_STEPS optimizer steps.
# The default size's, chosen on a validation split (docs/results/validation.md, "Three suites, one
# student"): half an epoch of the three suites' rows (the first half of the seed's shuffle) in
# steps of at most 4096 tokens, 29-33 minutes on 2 cores; one epoch in steps of 8192 (SFT_EPOCHS=1
# SFT_BATCH_TOKENS=8192) took validation multihop from 59% to 64% (the teacher 71%), math from 65%
# to 86% and code from 59% to 79%, in about an hour of SFT.
SFT_EPOCHS       ?= $(call by_size,,0.5,)
SFT_STEPS        ?= $(call by_size,300,,1500)
SFT_BATCH_TOKENS ?= $(call by_size,8192,4096,65536)
SFT_LR           ?= $(call by_size,2e-3,2e-4,1e-3)
SFT_MIN_LR       ?= $(call by_size,2e-4,2e-5,1e-4)
SFT_WARMUP       ?= $(call by_size,10,3,50)
SFT_SAVE_EVERY   ?= $(call by_size,50,20,250)
SFT_NEW_TOKEN_LR_MULT ?= 10
SFT_FREEZE_LAYERS     ?= 0
# 1: keep the teacher's retracted steps out of the loss (coa-tokenize --mask-retracted): a tool call
# that its reflection grades off track, like a planted buggy program before its fix. The student
# learns the recovery, not the misstep.
SFT_MASK_RETRACTED    ?= 0
ifeq ($(filter 0 1,$(SFT_MASK_RETRACTED)),)
$(error SFT_MASK_RETRACTED=$(SFT_MASK_RETRACTED): expected 0 or 1)
endif
SFT_FLAGS        ?=

SFT := $(RUNDIR)/sft
SFT_TOKENS := $(foreach s,$(SUITES),$(SFT)/$(s)/tokens.parquet)
SFT_LENGTH := $(if $(SFT_EPOCHS),--epochs $(SFT_EPOCHS),--steps $(SFT_STEPS))
SFT_MASKING := $(if $(filter 1,$(SFT_MASK_RETRACTED)),--mask-retracted)

ifneq ($(SFT_BASE),)
# A pretrained student: its tokenizer with the tags added, the same for every suite.
$(SFT)/tokenizer.json $(SFT)/$(SFT_BPE_SUITE)/tokens.parquet &: $(DISTILL)/$(SFT_BPE_SUITE)/coa_text.parquet $(SFT_BASE) | build
	@mkdir -p $(SFT)/$(SFT_BPE_SUITE)
	$(BIN)/coa-tokenize -i $< --tokenizer $(SFT_BASE) --save-tokenizer $(SFT)/tokenizer.json \
	    --max-len $(SFT_MAX_LEN) --overlong $(SFT_OVERLONG) $(SFT_MASKING) --stats $(SFT)/$(SFT_BPE_SUITE)/tokenize.json \
	    -o $(SFT)/$(SFT_BPE_SUITE)/tokens.parquet
SFT_INIT := --init $(SFT_BASE) --new-token-lr-mult $(SFT_NEW_TOKEN_LR_MULT) --freeze-layers $(SFT_FREEZE_LAYERS)
else
$(SFT)/tokenizer.json $(SFT)/$(SFT_BPE_SUITE)/tokens.parquet &: $(DISTILL)/$(SFT_BPE_SUITE)/coa_text.parquet | build
	@mkdir -p $(SFT)/$(SFT_BPE_SUITE)
	$(BIN)/coa-tokenize -i $< --train-bpe --vocab-size $(SFT_VOCAB) --save-tokenizer $(SFT)/tokenizer.json \
	    --max-len $(SFT_MAX_LEN) --overlong $(SFT_OVERLONG) $(SFT_MASKING) --stats $(SFT)/$(SFT_BPE_SUITE)/tokenize.json \
	    -o $(SFT)/$(SFT_BPE_SUITE)/tokens.parquet
SFT_INIT := --init-config $(SFT_MODEL)
endif

$(SFT)/%/tokens.parquet: $(DISTILL)/%/coa_text.parquet $(SFT)/tokenizer.json
	@mkdir -p $(@D)
	$(BIN)/coa-tokenize -i $< --tokenizer $(SFT)/tokenizer.json --max-len $(SFT_MAX_LEN) --overlong $(SFT_OVERLONG) \
	    $(SFT_MASKING) --stats $(@D)/tokenize.json -o $@

$(SFT)/metrics.parquet $(SFT)/loss.png &: $(SFT_TOKENS) $(SFT)/tokenizer.json
	$(BIN)/coa-train-step $(SFT_TOKENS) --objective sft $(SFT_INIT) --tokenizer $(SFT)/tokenizer.json \
	    --seed $(SEED) $(SFT_LENGTH) --batch-tokens $(SFT_BATCH_TOKENS) --lr $(SFT_LR) --min-lr $(SFT_MIN_LR) \
	    --warmup-steps $(SFT_WARMUP) --save $(SFT)/checkpoint --save-every $(SFT_SAVE_EVERY) \
	    --plot $(SFT)/loss.png --tensorboard $(RUNDIR)/tensorboard/sft --stats $(SFT)/train.json --device $(DEVICE) $(TRAIN_PRECISION_FLAGS) $(SFT_FLAGS) \
	    -o $(SFT)/metrics.parquet

.PHONY: sft
sft: $(SFT)/metrics.parquet
	@$(PYTHON) pipelines/sft_report.py $(SFT) $(SUITES) | tee $(SFT)/report.md
