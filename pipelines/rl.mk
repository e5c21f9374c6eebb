# Agentic RL (docs/ARCHITECTURE.md, "RL"): RL_ITERS iterations of DAPO from the SFT checkpoint. Each iteration is
# one pipe of four stages, with the scored rollouts also kept (tee) for inspection:
#   coa-generate policy | coa-score | tee scores.arrow | coa-filter --dynamic-sampling | coa-train-step --objective dapo
#   runs/<RUN>/rl/iter<k>/scores.arrow     rollouts with rewards and group advantages (an Arrow IPC stream)
#   runs/<RUN>/rl/iter<k>/checkpoint/      the policy after iteration k (HF layout)
#   runs/<RUN>/rl/iter<k>/metrics.parquet  DAPO steps: loss, reward, clip fraction, entropy, response length, mismatch
#   runs/<RUN>/rl/checkpoint               -> the last iteration's checkpoint
#   runs/<RUN>/tensorboard/rl/iter<k>/     the DAPO steps for `tensorboard --logdir runs/<RUN>/tensorboard`
# Iteration k draws its tasks from the training split (task ids ending in the digit k mod 10), so
# ten iterations in a row see different tasks; --oversample keeps generating until RL_GROUPS groups
# have unequal rewards.
# Each size's values: $(call by_size,SMOKE,DEFAULT,FULL) (see pipelines/default.mk).

RL_ITERS        ?= $(call by_size,2,2,10)
RL_SUITE        ?= $(call by_size,multihop,math,multihop)
RL_N            ?= $(call by_size,4,4,8)
RL_GROUPS       ?= $(call by_size,8,8,32)
RL_TEMPERATURE  ?= 1.0
RL_MAX_RESPONSE ?= $(call by_size,768,1536,3072)
RL_OVERLONG     ?= $(call by_size,96,256,256)
RL_MAX_TURNS    ?= $(call by_size,12,12,16)
# Sequences decoded together (policy --batch): samples do not depend on it, but --oversample judges
# whole groups as they finish, so a larger batch may draw a few more groups than needed.
RL_BATCH        ?= $(call by_size,16,32,128)
RL_LR           ?= $(call by_size,5e-5,5e-5,2e-5)
RL_BATCH_TOKENS ?= $(call by_size,16384,16384,65536)
# Layers frozen in SFT stay frozen in RL.
RL_FLAGS        ?= $(if $(filter-out 0,$(SFT_FREEZE_LAYERS)),--freeze-layers $(SFT_FREEZE_LAYERS))

RL := $(RUNDIR)/rl

$(RL)/checkpoint/config.json: $(SFT)/metrics.parquet $(RUNDIR)/tasks.parquet $(call corpus,$(RUNDIR))
	@prev=$(SFT)/checkpoint; \
	for k in $$(seq 1 $(RL_ITERS)); do \
	  d=$(RL)/iter$$k; mkdir -p $$d; echo "rl: iteration $$k of $(RL_ITERS) -> $$d"; \
	  $(BIN)/coa-filter -i $(RUNDIR)/tasks.parquet --rules none --where "suite = '$(RL_SUITE)' AND task_id LIKE '%$$((k % 10))'" 2>/dev/null \
	  | $(BIN)/coa-generate policy --checkpoint $$prev $(call corpus_flag,$(RUNDIR)) --n $(RL_N) --seed $$k \
	      --temperature $(RL_TEMPERATURE) --max-response-tokens $(RL_MAX_RESPONSE) --overlong-cache $(RL_OVERLONG) \
	      --max-turns $(RL_MAX_TURNS) --batch $(RL_BATCH) --oversample --groups $(RL_GROUPS) --model-name rl-iter$$k --device $(DEVICE) \
	      --stats $$d/policy.json \
	  | $(BIN)/coa-score --tasks $(RUNDIR)/tasks.parquet --max-response-len $(RL_MAX_RESPONSE) --overlong-cache $(RL_OVERLONG) \
	      --report $$d/rollouts.md --stats $$d/score.json \
	  | tee $$d/scores.arrow \
	  | $(BIN)/coa-filter --rules none --dynamic-sampling --group-by task_id --value reward --stats $$d/filter.json \
	  | $(BIN)/coa-train-step --objective dapo --init $$prev --seed $$k --lr $(RL_LR) --batch-tokens $(RL_BATCH_TOKENS) \
	      --device $(DEVICE) $(RL_FLAGS) --save $$d/checkpoint --tensorboard $(RUNDIR)/tensorboard/rl/iter$$k \
	      --stats $$d/train.json -o $$d/metrics.parquet; \
	  prev=$$d/checkpoint; \
	done; \
	rm -rf $(RL)/checkpoint.tmp && cp -r $$prev $(RL)/checkpoint.tmp && rm -rf $(RL)/checkpoint && mv $(RL)/checkpoint.tmp $(RL)/checkpoint
	$(PYTHON) pipelines/rl_report.py $(RL) $(RL_ITERS) | tee $(RL)/report.md
	$(BIN)/coa-train-step plot --bars $(RL)/curves.json -o $(RL)/curves.png

.PHONY: rl
rl: $(RL)/checkpoint/config.json
