# CUDA user-space pieces for the GPU path, from pinned pip wheels (no toolkit, no GPU needed):
# NVRTC (libnvrtc.so.13 + builtins) and the headers NVRTC needs (cuda_bf16.h), CUDA 13.0.
#   make cuda-deps    install them into .cuda/ (once; re-run when kernels/requirements-nvrtc.txt changes)
# coa-kernels finds .cuda/ by itself (current directory or any parent, or the repository); the
# exports below also let other tools use it.
CUDA_DEPS_DIR   ?= .cuda
CUDA_DEPS_REQ   := kernels/requirements-nvrtc.txt
CUDA_DEPS_STAMP := $(CUDA_DEPS_DIR)/.installed
PYTHON          ?= python3

export COA_CUDA_HOME    := $(abspath $(CUDA_DEPS_DIR))
export COA_CUDA_INCLUDE := $(COA_CUDA_HOME)/nvidia/cu13/include
export LD_LIBRARY_PATH  := $(COA_CUDA_HOME)/nvidia/cu13/lib$(if $(LD_LIBRARY_PATH),:$(LD_LIBRARY_PATH))

.PHONY: cuda-deps
cuda-deps: $(CUDA_DEPS_STAMP)

$(CUDA_DEPS_STAMP): $(CUDA_DEPS_REQ)
	rm -rf $(CUDA_DEPS_DIR)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
		--target $(CUDA_DEPS_DIR) -r $(CUDA_DEPS_REQ)
	test -f $(CUDA_DEPS_DIR)/nvidia/cu13/lib/libnvrtc.so.13
	test -f $(CUDA_DEPS_DIR)/nvidia/cu13/include/cuda_bf16.h
	touch $@
