# Agentic SFT (DESIGN §8): the distilled CoA text of every suite -> tokens with loss masks -> a
# fresh Llama (the SFT_MODEL preset) trained on DEVICE, saved as an HF checkpoint that also resumes exactly.
#   runs/<RUN>/sft/tokenizer.json            byte-level BPE (CoA tags as special tokens), trained on
#                                            the $(SFT_BPE_SUITE) suite's CoA text, used for every suite
#   runs/<RUN>/sft/<suite>/tokens.parquet    token ids + loss masks (observations and prompt masked)
#   runs/<RUN>/sft/checkpoint/               config.json, model.safetensors, generation_config.json,
#                                            tokenizer.json, optimizer.safetensors, trainer_state.json
#   runs/<RUN>/sft/metrics.parquet           one row per optimizer step (step, loss, lr, grad_norm, tokens/s)
#   runs/<RUN>/sft/loss.png                  the loss curve
#   runs/<RUN>/tensorboard/sft/              the per-step metrics for `tensorboard --logdir runs/<RUN>/tensorboard`
# The trainer prints the falling loss every few steps; `make sft` then prints the summary table
# (pipelines/sft_report.py). These defaults are SIZE=smoke's, sized to finish in under 10 minutes on
# 2 CPU cores; SIZE=full's (the `small` model, 3584-token rows) are set in pipelines/default.mk.

SFT_MODEL        ?= $(call by_size,tiny,small)
SFT_VOCAB        ?= $(call by_size,4096,8192)
SFT_BPE_SUITE    ?= multihop
# Longer sequences are cut at a token boundary outside any observation (coa-tokenize --overlong).
SFT_MAX_LEN      ?= $(call by_size,2048,3584)
SFT_OVERLONG     ?= truncate
SFT_STEPS        ?= $(call by_size,300,1500)
SFT_BATCH_TOKENS ?= $(call by_size,8192,65536)
SFT_LR           ?= $(call by_size,2e-3,1e-3)
SFT_MIN_LR       ?= $(call by_size,2e-4,1e-4)
SFT_WARMUP       ?= $(call by_size,10,50)
SFT_SAVE_EVERY   ?= $(call by_size,50,250)
SFT_FLAGS        ?=

SFT := $(RUNDIR)/sft
SFT_TOKENS := $(foreach s,$(SUITES),$(SFT)/$(s)/tokens.parquet)

$(SFT)/tokenizer.json $(SFT)/$(SFT_BPE_SUITE)/tokens.parquet &: $(DISTILL)/$(SFT_BPE_SUITE)/coa_text.parquet | build
	@mkdir -p $(SFT)/$(SFT_BPE_SUITE)
	$(BIN)/coa-tokenize -i $< --train-bpe --vocab-size $(SFT_VOCAB) --save-tokenizer $(SFT)/tokenizer.json \
	    --max-len $(SFT_MAX_LEN) --overlong $(SFT_OVERLONG) --stats $(SFT)/$(SFT_BPE_SUITE)/tokenize.json \
	    -o $(SFT)/$(SFT_BPE_SUITE)/tokens.parquet

$(SFT)/%/tokens.parquet: $(DISTILL)/%/coa_text.parquet $(SFT)/tokenizer.json
	@mkdir -p $(@D)
	$(BIN)/coa-tokenize -i $< --tokenizer $(SFT)/tokenizer.json --max-len $(SFT_MAX_LEN) --overlong $(SFT_OVERLONG) \
	    --stats $(@D)/tokenize.json -o $@

$(SFT)/metrics.parquet $(SFT)/loss.png &: $(SFT_TOKENS) $(SFT)/tokenizer.json
	$(BIN)/coa-train-step $(SFT_TOKENS) --objective sft --init-config $(SFT_MODEL) --tokenizer $(SFT)/tokenizer.json \
	    --seed $(SEED) --steps $(SFT_STEPS) --batch-tokens $(SFT_BATCH_TOKENS) --lr $(SFT_LR) --min-lr $(SFT_MIN_LR) \
	    --warmup-steps $(SFT_WARMUP) --save $(SFT)/checkpoint --save-every $(SFT_SAVE_EVERY) \
	    --plot $(SFT)/loss.png --tensorboard $(RUNDIR)/tensorboard/sft --stats $(SFT)/train.json --device $(DEVICE) $(SFT_FLAGS) \
	    -o $(SFT)/metrics.parquet

.PHONY: sft
sft: $(SFT)/metrics.parquet
	@$(PYTHON) pipelines/sft_report.py $(SFT) $(SUITES) | tee $(SFT)/report.md
