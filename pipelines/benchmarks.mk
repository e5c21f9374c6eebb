# `make eval-benchmarks`: checkpoints on the field's own benchmark files, with the CoA tools, scored
# by coa-score's graders, reported as AFM's tables do. Nothing is tuned on these files: they are
# read only here.
#   runs/<RUN>/benchmarks/tasks/<bench>.parquet                     the first BENCH_TASKS tasks of each file
#   runs/<RUN>/benchmarks/<model>/<bench>/{greedy,avg}.json           coa-score's reports (+ scores.parquet)
#   runs/<RUN>/benchmarks/report.md, benchmarks.png, times.tsv        the table, its plot, seconds per cell
# pass@1: one greedy answer a task. avg@k: the mean success of BENCH_K answers a task sampled at
# BENCH_TEMPERATURE (for the files in BENCH_AVG; AFM reports AIME so), with pass@k beside it.

BENCH_FILES       ?= math500.parquet aime24.parquet HumanEval.jsonl.gz livecodebench_v4.parquet
# Tasks a file (its first N, in the file's order); `all` for every task (794 of them in the four
# files: hours on 2 cores). 10 took 17.5 minutes of rollouts for the two students on a loaded 2-core
# Xeon, LiveCodeBench the longest (about 25 s a task).
BENCH_TASKS       ?= 10
# NAME=CHECKPOINT (an HF directory or a GGUF file) pairs, answering with the CoA tools.
BENCH_MODELS      ?= sft=$(SFT)/checkpoint rl=$(RL)/checkpoint
# NAME=CHECKPOINT pairs answering on their own, without tags or tools (coa-generate policy --plain,
# coa-score --plain): by default the pretrained SmolLM2-135M-Instruct the students start from.
BENCH_PLAIN_MODELS ?= base=$(SMOLLM2_GGUF)
BENCH_AVG         ?= aime24
BENCH_K           ?= 4
BENCH_TEMPERATURE ?= 0.6
BENCH := $(RUNDIR)/benchmarks

bench_first = $(if $(filter all,$(BENCH_TASKS)),,--first $(BENCH_TASKS))

.PHONY: eval-benchmarks
eval-benchmarks: | build $(if $(findstring $(SMOLLM2_GGUF),$(BENCH_PLAIN_MODELS)),model)
	@mkdir -p $(BENCH)/tasks
	@for f in $(BENCH_FILES); do \
	  test -f "$(COA_EXTERNAL_DATA)/$$f" || { echo "eval-benchmarks: $(COA_EXTERNAL_DATA)/$$f is missing: skipped"; continue; }; \
	  $(GENERATE) tasks --import "$(COA_EXTERNAL_DATA)/$$f" $(bench_first) -o $(BENCH)/tasks/$${f%%.*}.parquet; \
	done
	@for m in $(addprefix coa:,$(BENCH_MODELS)) $(addprefix plain:,$(BENCH_PLAIN_MODELS)); do \
	  answers=$${m%%:*}; m=$${m#*:}; name=$${m%%=*}; ckpt=$${m#*=}; \
	  plain=; [ $$answers = plain ] && plain=--plain; \
	  test -e "$$ckpt" || { echo "eval-benchmarks: $$name: no checkpoint $$ckpt (make pipeline first, or BENCH_MODELS=name=DIR|GGUF)"; exit 1; }; \
	  for t in $(BENCH)/tasks/*.parquet; do \
	    b=$$(basename $$t .parquet); d=$(BENCH)/$$name/$$b; mkdir -p $$d; \
	    runs="greedy"; case " $(BENCH_AVG) " in *" $$b "*) runs="greedy avg";; esac; \
	    for r in $$runs; do \
	      test -f $$d/$$r.json && continue; \
	      if [ $$r = greedy ]; then flags="--n 1 --temperature 0"; else flags="--n $(BENCH_K) --temperature $(BENCH_TEMPERATURE) --seed $(SEED)"; fi; \
	      start=$$(date +%s); \
	      $(GENERATE) policy --checkpoint $$ckpt -i $$t $$flags $$plain --max-response-tokens $(EVAL_MAX_RESPONSE) --max-turns $(EVAL_MAX_TURNS) \
	          --model-name $$name --batch $(EVAL_BATCH) --device $(DEVICE) $(DECODE_PRECISION_FLAGS) --stats $$d/$$r.policy.json \
	        | $(BIN)/coa-score --tasks $$t $$plain --max-response-len $(EVAL_MAX_RESPONSE) --overlong-cache 0 \
	          --report $$d/$$r.json --stats $$d/$$r.score.json -o $$d/$$r.parquet; \
	      printf '%s\t%s\t%s\t%s\n' $$name $$b $$r $$(( $$(date +%s) - start )) >> $(BENCH)/times.tsv; \
	      echo "eval-benchmarks: $$name $$b $$r: $$(( $$(date +%s) - start )) s"; \
	    done; \
	  done; \
	done
	@$(PYTHON) pipelines/benchmarks_report.py $(BENCH) "$(BENCH_K)" "$(BENCH_TEMPERATURE)" $(foreach m,$(BENCH_MODELS),$(firstword $(subst =, ,$(m)))) \
	  $(foreach m,$(BENCH_PLAIN_MODELS),$(firstword $(subst =, ,$(m))):plain) \
	  | tee $(BENCH)/report.md
	$(BIN)/coa-train-step plot --bars $(BENCH)/benchmarks.json -o $(BENCH)/benchmarks.png
	@echo "plot: $(BENCH)/benchmarks.png"
