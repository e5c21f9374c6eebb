# The embedded offline default run: sizes and seeds of `make pipeline`.
# Override any of these on the command line, e.g. `make tasks RUN=big N_MULTIHOP=5000`, or pick the
# real run's sizes with SIZE=full (below).

# Where the model trains and decodes (coa-train-step and coa-generate policy --device): cpu (the
# tiny default model, f32, deterministic), cuda (an NVIDIA GPU: bf16 kernels; the tiny preset's
# head_dim 32 is decodable there but not trainable, so pair it with SFT_MODEL=small or a larger
# config), or auto (the GPU when usable, else the CPU).
DEVICE     ?= cpu

# How big a run: smoke (the default on the CPU) or full (the default with DEVICE=cuda).
# smoke runs the whole loop in under 20 minutes on 2 cores. A teacher's trajectory takes, in
# response tokens with tool observations included, about 750 (math), 1,100 (code, at most 1,400)
# and 1,700 (multihop at the median, up to 2,800). smoke's evaluation budget (1408) fits math and
# code, but its RL budget (768, multihop) and its 2048-token training rows cut most multihop
# trajectories: smoke tests the loop, not the method.
# full is a real run's size: ten times the tasks, the `small` model (8 layers, d 512, head_dim 64),
# training rows of 3584 tokens, and budgets of 3072 response tokens and 16 turns, long enough for
# the teacher's trajectories. Each size variable gives both values, $(call by_size,SMOKE,FULL),
# here and in pipelines/*.mk; any variable given on the command line still wins.
SIZE ?= $(if $(filter cuda%,$(DEVICE)),full,smoke)
ifeq ($(filter smoke full,$(SIZE)),)
$(error SIZE=$(SIZE): expected smoke or full)
endif
by_size = $(if $(filter full,$(SIZE)),$(2),$(1))

RUN        ?= $(call by_size,default,full)
SEED       ?= 1
TEST_SEED  ?= 2

# Tasks per suite, training split and held-out test split.
N_MULTIHOP ?= $(call by_size,1000,10000)
N_MATH     ?= $(call by_size,300,3000)
N_CODE     ?= $(call by_size,300,3000)
TEST_N_MULTIHOP ?= 200
TEST_N_MATH     ?= 100
TEST_N_CODE     ?= 100

# Distillation: kept trajectories have at most this many agent/tool interactions (a `--where`
# rule of coa-filter, counted with the others), and the scripted teacher's flags.
MAX_HOPS  ?= 20
MAS_FLAGS ?=
