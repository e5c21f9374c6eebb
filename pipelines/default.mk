# The embedded offline default run: sizes and seeds of `make pipeline`.
# Override any of these on the command line, e.g. `make tasks RUN=big N_MULTIHOP=5000`, or pick the
# real run's sizes with SIZE=full (below).

# Where the model trains and decodes (coa-train-step and coa-generate policy --device): cpu (the
# tiny default model, f32, deterministic), cuda (an NVIDIA GPU: bf16 kernels; the tiny preset's
# head_dim 32 is decodable there but not trainable, so pair it with SFT_MODEL=small or a larger
# config), or auto (the GPU when usable, else the CPU).
DEVICE     ?= cpu

# How big a run: smoke (the default on the CPU) or full (the default with DEVICE=cuda).
# smoke runs the whole loop in under 20 minutes on 2 cores. Its rollout budgets (RL 768, eval 512
# response tokens) are far shorter than a teacher's trajectory: in response tokens, tool
# observations included, math takes about 750, code 1,100, multihop 1,700 at the median and up to
# 2,800. smoke therefore tests the loop, not the method: its students cannot finish a multihop task.
# full is a real run's size: ten times the tasks, the `small` model (8 layers, d 512, head_dim 64),
# training rows of 3072 tokens, and budgets of 2816 response tokens and 16 turns, long enough for
# the teacher's trajectories. Its variables are set here, before the smoke defaults in
# pipelines/*.mk; any variable given on the command line still wins.
SIZE ?= $(if $(filter cuda%,$(DEVICE)),full,smoke)
ifeq ($(SIZE),full)
RUN               ?= full
N_MULTIHOP        ?= 10000
N_MATH            ?= 3000
N_CODE            ?= 3000
SFT_MODEL         ?= small
SFT_VOCAB         ?= 8192
SFT_MAX_LEN       ?= 3072
SFT_STEPS         ?= 1500
SFT_BATCH_TOKENS  ?= 65536
SFT_LR            ?= 1e-3
SFT_MIN_LR        ?= 1e-4
SFT_WARMUP        ?= 50
SFT_SAVE_EVERY    ?= 250
RL_ITERS          ?= 10
RL_N              ?= 8
RL_GROUPS         ?= 32
RL_MAX_RESPONSE   ?= 2816
RL_OVERLONG       ?= 256
RL_MAX_TURNS      ?= 16
RL_BATCH          ?= 128
RL_LR             ?= 2e-5
RL_BATCH_TOKENS   ?= 65536
EVAL_MAX_RESPONSE ?= 2816
EVAL_MAX_TURNS    ?= 16
EVAL_BATCH        ?= 200
else ifneq ($(SIZE),smoke)
$(error SIZE=$(SIZE): expected smoke or full)
endif
RUN        ?= default
SEED       ?= 1
TEST_SEED  ?= 2

# Tasks per suite, training split and held-out test split.
N_MULTIHOP ?= 1000
N_MATH     ?= 300
N_CODE     ?= 300
TEST_N_MULTIHOP ?= 200
TEST_N_MATH     ?= 100
TEST_N_CODE     ?= 100

# Distillation: kept trajectories have at most this many agent/tool interactions (a `--where`
# rule of coa-filter, counted with the others), and the scripted teacher's flags.
MAX_HOPS  ?= 20
MAS_FLAGS ?=
