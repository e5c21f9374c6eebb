# The embedded offline default run: sizes and seeds of `make pipeline`.
# Override any of these on the command line, e.g. `make tasks RUN=big N_MATH=5000`, or pick
# another size with SIZE=smoke|full (below).

# Where the model trains and decodes (coa-train-step and coa-generate policy --device): cpu
# (deterministic, in PRECISION below), cuda (an NVIDIA GPU: bf16 kernels; the tiny preset's
# head_dim 32 is decodable there but not trainable, so pair it with SFT_MODEL=small or a larger
# config), or auto (the GPU when usable, else the CPU).
DEVICE     ?= cpu

# How big a run: default (on the CPU), smoke, or full (the default with DEVICE=cuda).
# A teacher's trajectory takes, in response tokens with tool observations included, about 750
# (math), 1,100 (code, at most 1,400) and 2,100 (multihop at the median, up to 3,300; a crawl
# returns the 250 characters of the page that answer the agent's goal).
# default: the whole method on 2 CPU cores in about an hour. The student is a pretrained model,
#   SmolLM2-135M-Instruct (`make model` fetches it), fully fine-tuned in bf16 products for half an
#   epoch on the distilled multihop, math and code trajectories, improved by RL on math, and
#   compared with the teacher on 100 held-out tasks of each suite: 56 min 48 s measured on
#   2026-12-06, build excluded (SFT 28 at about 297 tokens/s, RL 7, eval 21) on an Intel Xeon
#   with AMX, 61 on an AMD EPYC with avx512_bf16 the day before (before two speedups). One epoch (SFT_EPOCHS=1
#   SFT_BATCH_TOKENS=8192) was the better student on a validation split and about 90 minutes
#   there (README, "Results of the default run").
# smoke: the loop's plumbing in under 20 minutes: a 1M-parameter model from scratch (it learns
#   the format, not the tasks), every suite, short budgets.
# full: a real run's size for a GPU: ten times the tasks, the `small` model (8 layers, d 512) from
#   scratch, training rows of 3584 tokens, budgets of 3072 response tokens and 16 turns.
# Each size variable gives the three values, $(call by_size,SMOKE,DEFAULT,FULL), here and in
# pipelines/*.mk; any variable given on the command line still wins.
SIZE ?= $(if $(filter cuda%,$(DEVICE)),full,default)
ifeq ($(filter smoke default full,$(SIZE)),)
$(error SIZE=$(SIZE): expected default, smoke or full)
endif
by_size = $(if $(filter full,$(SIZE)),$(3),$(if $(filter smoke,$(SIZE)),$(1),$(2)))

# The CPU's arithmetic for the student's products (linear layers, attention and head): bf16 (inputs
# rounded to bf16, f32 sums: coa-train-step --matmul bf16, coa-generate policy --decode-weights
# bf16-matmul --kv-cache bf16; on AMX tiles or AVX-512 BF16 dot products where the CPU has them,
# PyTorch's CPU autocast) or f32 (bit for bit the same numbers on every CPU, in training and
# decoding). bf16 is the default size's since the web agent joined its run: on this project's 2-core
# AMD EPYC with avx512_bf16 its dot products run at twice the f32 rate (235 against 117 GFLOP/s a
# core) and the three suites' SFT at about 250 tokens/s; a bf16 run's numbers differ in the last
# bits between CPU kinds (AMX tiles, dot products, or the f32 kernel on rounded copies). smoke
# stays f32, bit for bit the same on every CPU. The GPU (DEVICE=cuda) multiplies in bf16 whatever
# this says.
PRECISION  ?= $(call by_size,f32,bf16,bf16)
ifeq ($(filter f32 bf16,$(PRECISION)),)
$(error PRECISION=$(PRECISION): expected f32 or bf16)
endif
cpu_bf16 = $(if $(filter bf16,$(PRECISION)),$(if $(filter cpu,$(DEVICE)),$(1)))
TRAIN_PRECISION_FLAGS  = $(call cpu_bf16,--matmul bf16)
DECODE_PRECISION_FLAGS = $(call cpu_bf16,--decode-weights bf16-matmul --kv-cache bf16)

RUN        ?= $(call by_size,smoke,default,full)
# The suites of the run: distilled, trained on and evaluated.
SUITES     ?= multihop math code
SEED       ?= 1
TEST_SEED  ?= 2

# Tasks per suite, training split and held-out test split.
N_MULTIHOP ?= $(call by_size,1000,1000,10000)
N_MATH     ?= $(call by_size,300,300,3000)
N_CODE     ?= $(call by_size,300,300,3000)
TEST_N_MULTIHOP ?= $(call by_size,200,100,200)
TEST_N_MATH     ?= 100
TEST_N_CODE     ?= 100
# `--suite S --n N` for each of SUITES, train ($(1) = N) or test ($(1) = TEST_N) split.
suite_flags = $(foreach s,$(SUITES),--suite $(s) --n $($(1)_$(if $(filter multihop,$(s)),MULTIHOP,$(if $(filter math,$(s)),MATH,CODE))))

# Only multihop tasks search a document corpus (the offline web), so a run without multihop has
# none: $(call corpus,DIR) is DIR/corpus.parquet or nothing, $(call corpus_flag,DIR) its --corpus flag.
corpus = $(if $(filter multihop,$(SUITES)),$(1)/corpus.parquet)
corpus_flag = $(if $(call corpus,$(1)),--corpus $(call corpus,$(1)))

# Distillation: kept trajectories have at most this many agent/tool interactions (a `--where`
# rule of coa-filter, counted with the others), and the scripted teacher's flags.
MAX_HOPS  ?= 20
# ... and at least this many on math (pipelines/distill.mk, MIN_HOPS): the default run keeps the
# teacher's one-call math solutions, which the student then learns to write; chosen on a
# validation split, where it took SFT+RL from 82% to 97% at half the tokens per solved task.
MIN_HOPS_math ?= $(call by_size,,4,)
MAS_FLAGS ?=
