# Agentic RL (docs/ARCHITECTURE.md, "RL"): RL_ITERS iterations of DAPO from the SFT checkpoint. Each iteration is
# one pipe of four stages, with the scored rollouts also kept (tee) for inspection:
#   coa-generate policy | coa-score | tee scores.arrows | coa-filter --dynamic-sampling | coa-train-step --objective dapo
#   runs/<RUN>/rl/iter<k>/scores.arrows    rollouts with rewards and group advantages (an Arrow IPC stream)
#   runs/<RUN>/rl/iter<k>/rollouts.parquet the merged rollouts (sharded runs only; parts in rollouts.parquet.shards/)
#   runs/<RUN>/rl/iter<k>/checkpoint/      the policy after iteration k (HF layout)
#   runs/<RUN>/rl/iter<k>/metrics.parquet  DAPO steps: loss, reward, clip fraction, entropy, response length, mismatch
#   runs/<RUN>/rl/checkpoint               -> the last iteration's checkpoint
#   runs/<RUN>/tensorboard/rl/iter<k>/     the DAPO steps for `tensorboard --logdir runs/<RUN>/tensorboard`
# Iteration k draws its tasks from the training split (task ids ending in the digit k mod 10), so
# ten iterations in a row see different tasks; --oversample keeps generating until RL_GROUPS groups
# have unequal rewards (RL_OVERSAMPLE=0: every task of the iteration, RL_GROUPS unused).
#
# Sharded (EXECUTOR=local|slurm SHARDS=N, pipelines/shard.mk): the rollouts of each iteration run
# as N shards of the iteration's tasks, merged in task order into iter<k>/rollouts.parquet (the parts
# in iter<k>/rollouts.parquet.shards/); scoring, dynamic sampling and the DAPO step then run once
# on the merged table, as in the unsharded pipe. A GRPO group is one task's samples and a task lives
# in one shard, so no group straddles shards. Each sample's random stream is keyed by (seed,
# task_id, sample index), so a task draws the same samples sharded or not. What differs with
# --oversample: each shard wants its share of RL_GROUPS (RL_GROUPS/N, one more for the first
# RL_GROUPS mod N shards) and takes its own tasks in order until it has them, so which tasks are
# drawn (and how many rollouts there are) can differ from the unsharded run, which takes the first
# tasks of the whole list; a shard that runs out of tasks leaves its share short. With
# RL_OVERSAMPLE=0 the merged rollouts equal the unsharded ones row for row (on the CPU; a GPU's
# bf16 decoding may differ with the batch).
# Each size's values: $(call by_size,SMOKE,DEFAULT,FULL) (see pipelines/default.mk).

RL_ITERS        ?= $(call by_size,2,2,10)
# The default size trains on math: on 2 cores one multihop iteration (8 groups of 4 answers with
# the real search and crawl tools, 3,072 response tokens) measured about 11 minutes against math's
# 4 (2026-12-05; README, "Against the targets"): two would add 13 minutes to a run already at 61.
RL_SUITE        ?= $(call by_size,multihop,math,multihop)
RL_N            ?= $(call by_size,4,4,8)
RL_GROUPS       ?= $(call by_size,8,8,32)
RL_OVERSAMPLE   ?= 1
ifeq ($(filter 0 1,$(RL_OVERSAMPLE)),)
$(error RL_OVERSAMPLE=$(RL_OVERSAMPLE): expected 1 (draw tasks until RL_GROUPS informative groups) or 0 (every task))
endif
RL_TEMPERATURE  ?= 1.0
RL_MAX_RESPONSE ?= $(call by_size,768,1536,3072)
RL_OVERLONG     ?= $(call by_size,96,256,256)
RL_MAX_TURNS    ?= $(call by_size,12,12,16)
# Sequences decoded together (policy --batch): samples do not depend on it, but --oversample judges
# whole groups as they finish, so a larger batch may draw a few more groups than needed.
RL_BATCH        ?= $(call by_size,16,32,128)
# The pretrained student's RL lr was chosen on a validation split (never the test split): at 5e-5
# two DAPO iterations flipped the greedy plan of every task to a variant that had won a few
# sampled groups (validation 65% after one iteration, 27.5% after two); at 5e-6, 90% after one.
# Measured again on the math+code default (2026-11-29, validation math, SFT 81%): 5e-6 gives 82%,
# 87% and 84% after 2, 3 and 4 iterations; 1e-5 gives 68% after 2 (docs/results/validation.md).
RL_LR           ?= $(call by_size,5e-5,5e-6,2e-5)
# A DAPO step of 16,384 tokens of multihop answers (rows up to ~6,000 tokens) needs more than 24 GB
# on the CPU; 8,192 peaked at 16.5 GB (the default size with RL_SUITE=multihop takes that).
RL_BATCH_TOKENS ?= $(call by_size,16384,$(if $(filter multihop,$(RL_SUITE)),8192,16384),65536)
# Layers frozen in SFT stay frozen in RL.
RL_FLAGS        ?= $(if $(filter-out 0,$(SFT_FREEZE_LAYERS)),--freeze-layers $(SFT_FREEZE_LAYERS))

RL := $(RUNDIR)/rl

# Iteration $$k's tasks | its rollouts from checkpoint $$prev (shell variables of the loop below).
rl_tasks = $(BIN)/coa-filter -i $(RUNDIR)/tasks.parquet --rules none --where "suite = '$(RL_SUITE)' AND task_id LIKE '%$$((k % 10))'" 2>/dev/null
# (--overlong-cache: the shaping --oversample judges groups with.)
rl_oversampling := $(filter 1,$(RL_OVERSAMPLE))
rl_policy = $(BIN)/coa-generate policy --checkpoint $$prev $(call corpus_flag,$(RUNDIR)) --n $(RL_N) --seed $$k \
	      --temperature $(RL_TEMPERATURE) --max-response-tokens $(RL_MAX_RESPONSE) $(if $(rl_oversampling),--overlong-cache $(RL_OVERLONG)) \
	      --max-turns $(RL_MAX_TURNS) --batch $(RL_BATCH) $(if $(rl_oversampling),--oversample --groups $(RL_GROUPS)) \
	      --model-name rl-iter$$k --device $(DEVICE) $(DECODE_PRECISION_FLAGS)
# The rollouts into coa-score: piped, or as shards merged into $$d/rollouts.parquet that it reads.
ifeq ($(SHARDED),)
rl_rollouts = $(rl_tasks) | $(rl_policy) --stats $$d/policy.json |
rl_score_input =
else
rl_rollouts = $(call sharded,$$d/rollouts.parquet,$$d/policy.json,$(RUNDIR)/tasks.parquet,\
	  $(rl_tasks) | $(rl_policy) $$SHARD --stats $$STATS -o $$OUT,--var k=$$k --var prev=$$prev --content "$$(echo $$prev/model*.safetensors)");
rl_score_input = -i $$d/rollouts.parquet
endif

$(RL)/checkpoint/config.json: $(SFT)/metrics.parquet $(RUNDIR)/tasks.parquet $(call corpus,$(RUNDIR))
	@prev=$(SFT)/checkpoint; \
	for k in $$(seq 1 $(RL_ITERS)); do \
	  d=$(RL)/iter$$k; mkdir -p $$d; echo "rl: iteration $$k of $(RL_ITERS) -> $$d"; \
	  $(rl_rollouts) $(BIN)/coa-score $(rl_score_input) --tasks $(RUNDIR)/tasks.parquet --max-response-len $(RL_MAX_RESPONSE) --overlong-cache $(RL_OVERLONG) \
	      --report $$d/rollouts.md --stats $$d/score.json \
	  | tee $$d/scores.arrows \
	  | $(BIN)/coa-filter --rules none --dynamic-sampling --group-by task_id --value reward --stats $$d/filter.json \
	  | $(BIN)/coa-train-step --objective dapo --init $$prev --seed $$k --lr $(RL_LR) --batch-tokens $(RL_BATCH_TOKENS) \
	      --device $(DEVICE) $(TRAIN_PRECISION_FLAGS) $(RL_FLAGS) --save $$d/checkpoint --tensorboard $(RUNDIR)/tensorboard/rl/iter$$k \
	      --stats $$d/train.json -o $$d/metrics.parquet; \
	  prev=$$d/checkpoint; \
	done; \
	rm -rf $(RL)/checkpoint.tmp && cp -r $$prev $(RL)/checkpoint.tmp && rm -rf $(RL)/checkpoint && mv $(RL)/checkpoint.tmp $(RL)/checkpoint
	$(PYTHON) pipelines/rl_report.py $(RL) $(RL_ITERS) | tee $(RL)/report.md
	$(BIN)/coa-train-step plot --lines $(RL)/curves.json -o $(RL)/curves.png

.PHONY: rl
rl: $(RL)/checkpoint/config.json
