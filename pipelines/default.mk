# The embedded offline default run: sizes and seeds of `make pipeline`.
# Override any of these on the command line, e.g. `make tasks RUN=big N_MULTIHOP=5000`.

RUN        ?= default
# Where the model trains and decodes (coa-train-step and coa-generate policy --device): cpu (the
# tiny default model, f32, deterministic), cuda (an NVIDIA GPU: bf16 kernels; the tiny preset's
# head_dim 32 is decodable there but not trainable, so pair it with SFT_MODEL=small or a larger
# config), or auto (the GPU when usable, else the CPU).
DEVICE     ?= cpu
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
