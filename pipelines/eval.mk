# Evaluation on the held-out test split (docs/ARCHITECTURE.md, "Evaluation"), the paper's comparison: the teacher
# multi-agent system vs the distilled model (SFT) vs SFT+RL, in success and tokens per solved
# task. The students answer greedily (one sample per task) with the same real tools.
#   runs/<RUN>/eval/teacher/mas_runs.parquet + mas.json   the teacher on the test tasks
#   runs/<RUN>/eval/<sft|rl>/scores.parquet + report.json  the students, scored
#   runs/<RUN>/eval/report.md, pipeline.png                the table and its plot

# A multihop answer takes up to five searches and five crawls: 3072 response tokens and 16 turns
# (on the validation split 9 of 100 multihop answers of the one-epoch student still ran out of the
# budget, 1 out of the turns).
EVAL_MAX_RESPONSE ?= $(call by_size,1408,3072,3072)
# Evaluation counts correct answers; its rewards carry no length shaping (`--overlong-cache 0`:
# the budget already caps the response), so any EVAL_MAX_RESPONSE works, even one under 512.
EVAL_MAX_TURNS    ?= $(call by_size,12,16,16)
# Sequences decoded together (policy --batch); the output does not depend on it.
EVAL_BATCH        ?= $(call by_size,32,50,200)
EVAL := $(RUNDIR)/eval

# The teacher and the students' rollouts run as SHARDS shards with EXECUTOR=slurm|local (pipelines/shard.mk).
$(EVAL)/teacher/mas_runs.parquet: $(RUNDIR)/test/tasks.parquet $(call corpus,$(RUNDIR)/test) | build
	$(call sharded,$@,$(EVAL)/teacher/mas.json,$(RUNDIR)/test/tasks.parquet,\
	  $(GENERATE) mas -i $(RUNDIR)/test/tasks.parquet $(call corpus_flag,$(RUNDIR)/test) --seed $(SEED) $(MAS_FLAGS) $$SHARD \
	    --stats $$STATS -o $$OUT)

# A student's greedy rollouts ($(1): sft | rl, $(2): its checkpoint directory), into coa-score:
# piped, or (sharded) as SHARDS shards of the test tasks merged in task order into
# eval/<student>/rollouts.parquet, which coa-score reads. Greedy decoding (temperature 0, one
# sample per task) is per task, so the merged rollouts, the scores and the report are the
# unsharded ones.
student_policy = $(GENERATE) policy --checkpoint $(2) -i $(RUNDIR)/test/tasks.parquet $(call corpus_flag,$(RUNDIR)/test) \
	    --n 1 --temperature 0 --max-response-tokens $(EVAL_MAX_RESPONSE) --max-turns $(EVAL_MAX_TURNS) --model-name $(1) \
	    --batch $(EVAL_BATCH) --device $(DEVICE) $(DECODE_PRECISION_FLAGS)
ifeq ($(SHARDED),)
student_rollouts = $(call student_policy,$(1),$(2)) --stats $(EVAL)/$(1)/policy.json |
student_score_input =
else
student_rollouts = $(call sharded,$(EVAL)/$(1)/rollouts.parquet,$(EVAL)/$(1)/policy.json,$(RUNDIR)/test/tasks.parquet,\
	$(call student_policy,$(1),$(2)) $$SHARD --stats $$STATS -o $$OUT);
student_score_input = -i $(EVAL)/$(1)/rollouts.parquet
endif

# $(1): sft | rl, $(2): the file that marks its training done, $(3): its checkpoint directory
# ($$(call ...): expanded when the recipe runs, where the sharded command's $$^ is the prerequisites)
define eval_student
$(EVAL)/$(1)/scores.parquet: $(2) $(RUNDIR)/test/tasks.parquet $(call corpus,$(RUNDIR)/test)
	@mkdir -p $(EVAL)/$(1)
	$$(call student_rollouts,$(1),$(3)) $(BIN)/coa-score $$(call student_score_input,$(1)) --tasks $(RUNDIR)/test/tasks.parquet \
	    --max-response-len $(EVAL_MAX_RESPONSE) --overlong-cache 0 --report $(EVAL)/$(1)/report.json --stats $(EVAL)/$(1)/score.json -o $$@
endef
$(eval $(call eval_student,sft,$(SFT)/metrics.parquet,$(SFT)/checkpoint))
$(eval $(call eval_student,rl,$(RL)/checkpoint/config.json,$(RL)/checkpoint))

.PHONY: eval
eval: $(EVAL)/teacher/mas_runs.parquet $(EVAL)/sft/scores.parquet $(EVAL)/rl/scores.parquet
	@$(PYTHON) pipelines/pipeline_report.py $(EVAL) | tee $(EVAL)/report.md
	$(BIN)/coa-train-step plot --bars $(EVAL)/pipeline.json -o $(EVAL)/pipeline.png
	@echo "plot: $(EVAL)/pipeline.png"
