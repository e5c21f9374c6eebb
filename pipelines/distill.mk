# Multi-agent distillation (docs/ARCHITECTURE.md, "Teacher and distillation"), per suite, every intermediate kept for inspection:
#   runs/<RUN>/distill/<suite>/mas_runs.parquet      teacher multi-agent runs (every activation)
#   runs/<RUN>/distill/<suite>/trajectories.parquet  linear CoA steps
#   runs/<RUN>/distill/<suite>/kept.parquet          after the filter rules (dropped.parquet: the rest, with reasons)
#   runs/<RUN>/distill/<suite>/coa_text.parquet      CoA text with observation spans (+ alpaca.json for AFM's LLaMA-Factory,
#                                                  sharegpt.json for upstream LLaMA-Factory, their dataset_info.json, verl.parquet)
# `make distill` then prints the summary table (pipelines/distill_report.py).

DISTILL := $(RUNDIR)/distill

# coa-filter's complexity rule drops trajectories with fewer than MIN_HOPS agent/tool
# interactions; MIN_HOPS_<suite> (e.g. MIN_HOPS_math=4) sets it for one suite. At 5 a math or
# code trajectory needs two tool calls (a set-up round, edge inputs or a fixed mistake) to be kept,
# and the student learns to make two on every task; at 4 one-call solutions are kept too
# (docs/results/validation.md, "One-call trajectories").
MIN_HOPS ?= 5
min_hops = $(or $(MIN_HOPS_$(1)),$(MIN_HOPS))

# The teacher and the extraction run as SHARDS shards with EXECUTOR=slurm|local (pipelines/shard.mk);
# the rest reads the merged tables.
mas_cmd = $(BIN)/coa-filter -i $(RUNDIR)/tasks.parquet --rules none --where "suite = '$(1)'" \
	| $(BIN)/coa-generate mas $(call corpus_flag,$(RUNDIR)) --seed $(SEED) $(MAS_FLAGS) $$SHARD --stats $$STATS -o $$OUT

$(DISTILL)/%/mas_runs.parquet: $(RUNDIR)/tasks.parquet $(call corpus,$(RUNDIR)) | build
	$(call sharded,$@,$(DISTILL)/$*/mas.json,$(RUNDIR)/tasks.parquet,$(call mas_cmd,$*))

$(DISTILL)/%/trajectories.parquet: $(DISTILL)/%/mas_runs.parquet
	$(call sharded,$@,$(DISTILL)/$*/extract.json,$(RUNDIR)/tasks.parquet,$(BIN)/coa-extract -i $$IN $$SHARD --stats $$STATS -o $$OUT,,$<)

$(DISTILL)/%/kept.parquet: $(DISTILL)/%/trajectories.parquet
	$(BIN)/coa-filter -i $< --seed $(SEED) --min-hops $(call min_hops,$*) --where "hops <= $(MAX_HOPS)" --keep-dropped $(DISTILL)/$*/dropped.parquet \
	    --stats $(DISTILL)/$*/filter.json -o $@

$(DISTILL)/%/coa_text.parquet: $(DISTILL)/%/kept.parquet
	$(BIN)/coa-convert -i $< --stats $(DISTILL)/$*/convert.json -o $@
	$(BIN)/coa-convert -i $< --to alpaca-json -o $(DISTILL)/$*/alpaca.json
	$(BIN)/coa-convert -i $< --to sharegpt -o $(DISTILL)/$*/sharegpt.json
	$(BIN)/coa-convert -i $< --to verl --tasks $(RUNDIR)/tasks.parquet -o $(DISTILL)/$*/verl.parquet

.PRECIOUS: $(DISTILL)/%/mas_runs.parquet $(DISTILL)/%/trajectories.parquet $(DISTILL)/%/kept.parquet

distill: $(foreach s,$(SUITES),$(DISTILL)/$(s)/coa_text.parquet)
	@$(PYTHON) pipelines/distill_report.py $(DISTILL) $(SUITES) | tee $(DISTILL)/report.md
