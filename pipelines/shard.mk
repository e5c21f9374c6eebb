# Sharded runs, locally or on a Slurm cluster. The expensive row-by-row stages (the teacher
# `coa-generate mas`, `coa-extract`, the policy's rollouts in rl and eval) run as SHARDS shards
# (`--shard I/N`, by a stable hash of task_id), then merge into one file in the unsharded row order:
#   make distill EXECUTOR=slurm SHARDS=64 SLURM_PARTITION=cpu SLURM_TIME=04:00:00
#   runs/<RUN>/distill/<suite>/mas_runs.parquet.shards/part-IIIII-of-NNNNN.parquet   shard I's table
#                                                     .../part-IIIII-of-NNNNN.json      its --stats
#                                                     .../logs/                         each shard's log, and
#                                                     .../logs/index.tsv                shard, job, attempt, state, seconds, log
#                                                     .../job.sh                        the job script
# EXECUTOR=local (the default) runs the shards as parallel processes with the same job script;
# SHARDS=1 with EXECUTOR=local is the plain one-process run. A shard whose output exists is not
# rerun: the same command resumes a half-finished array (see pipelines/shards.sh).
EXECUTOR        ?= local
SHARDS          ?= 1
# Reruns of the shards that left no output (a killed or failed array task) before giving up.
MAX_RETRIES     ?= 2
# sbatch's --partition (empty: the cluster's default), --time, --cpus-per-task, --mem; extra flags.
SLURM_PARTITION ?=
SLURM_TIME      ?= 01:00:00
SLURM_CPUS      ?= 2
SLURM_MEM       ?= 4G
SLURM_FLAGS     ?=
# At most this many tasks of one array run at once (sbatch --array=...%K; empty: no limit).
SLURM_ARRAY_LIMIT ?=

# make submit: the run as a chain of Slurm driver jobs, and this shell can go (pipelines/submit.sh):
#   make submit GOALS=pipeline SHARDS=64 RUN=big SLURM_PARTITION=cpu
# GOALS: what the drivers make; the driver jobs' own resources (they run the merges, the filters,
# SFT and DAPO; the shards run in their arrays):
GOALS             ?= pipeline
SLURM_DRIVER_TIME ?= 12:00:00
SLURM_DRIVER_CPUS ?= 4
SLURM_DRIVER_MEM  ?= 16G

ifeq ($(filter local slurm,$(EXECUTOR)),)
$(error EXECUTOR=$(EXECUTOR): expected local or slurm)
endif

shell_quote = '$(subst ','\'',$(1))'

# Empty for the plain one-process run (EXECUTOR=local SHARDS=1), `yes` for a sharded one: rules
# whose sharded form has an extra step (rl and eval merge the rollouts, then score them) test it.
SHARDED := $(if $(and $(filter local,$(EXECUTOR)),$(filter 1,$(SHARDS))),,yes)

# $(call sharded,OUT,STATS,ORDER,COMMAND[,SHARDS_ARGS[,INPUT]]): COMMAND (a shell snippet using
# $$SHARD, $$OUT and $$STATS) writes OUT and STATS, unsharded or as SHARDS shards merged in the row
# order of the task_id column of ORDER. SHARDS_ARGS: more pipelines/shards.sh arguments (--var
# NAME=VALUE for a shell variable COMMAND reads, --content FILE for an input that is not a
# prerequisite). INPUT: the table COMMAND reads as $$IN; sharded, where INPUT was merged from the
# same number of shards, each shard reads its own part of it instead of the whole table.
sharded = $(if $(SHARDED),\
	pipelines/shards.sh --executor $(EXECUTOR) --shards $(SHARDS) --retries $(MAX_RETRIES) --bin $(BIN) \
	    --partition $(call shell_quote,$(SLURM_PARTITION)) --time $(SLURM_TIME) --cpus $(SLURM_CPUS) --mem $(call shell_quote,$(SLURM_MEM)) \
	    --sbatch-flags $(call shell_quote,$(SLURM_FLAGS)) $(if $(SLURM_ARRAY_LIMIT),--array-limit $(SLURM_ARRAY_LIMIT)) --out $(1) --stats $(2) --order $(3) --inputs "$^" $(5) $(if $(6),--input-parts $(6)) -- $(call shell_quote,$(4)),\
	SHARD=; OUT=$(1); STATS=$(2); IN=$(6); $(4))

# The command-line settings (MAKEOVERRIDES, spaces kept) go to the drivers' make, with RUN fixed.
.PHONY: submit status
submit: build
	pipelines/submit.sh --rundir $(RUNDIR) --time $(SLURM_DRIVER_TIME) --cpus $(SLURM_DRIVER_CPUS) --mem $(call shell_quote,$(SLURM_DRIVER_MEM)) \
	    --partition $(call shell_quote,$(SLURM_PARTITION)) --sbatch-flags $(call shell_quote,$(SLURM_FLAGS)) \
	    -- $(GOALS) $(filter-out GOALS=% RUN=% EXECUTOR=%,$(MAKEOVERRIDES)) RUN=$(RUN)

# make status RUN=...: the run's driver job and every sharded stage (parts done, arrays queued or running).
status:
	@pipelines/status.sh $(RUNDIR)
