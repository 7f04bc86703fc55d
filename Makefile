# Tandem build. Public targets install missing Debian packages first (`deps`), then build.
#   make            build bin/tandem
#   make run        the main job on the default model (README)
#   make test       the whole suite (tests/run.sh); last line "N passed, N failed, N skipped"
#   make pyenv      the Python reference environment .venv/ (Debian's torch + eval/requirements.txt)
#   make cuda       also build the CUDA backend (needs nvcc) and its test binary
CC      ?= gcc
CXX     ?= g++
NVCC    ?= nvcc
OPT     ?= -O2 -march=native
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
# OpenBLAS's OpenMP build: it shares libgomp's thread pool with our kernels instead of fighting it
BLAS_DIR   := /usr/lib/x86_64-linux-gnu/openblas-openmp
BLAS_INC   := /usr/include/x86_64-linux-gnu/openblas-openmp
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)
CFLAGS  += -std=c11 -D_GNU_SOURCE $(OPT) -Wall -Wextra -Wpointer-arith -I. -I$(BLAS_INC) $(MPI_CFLAGS) -fopenmp
CXXFLAGS+= -std=c++17 $(OPT) -Wall -Wextra -I.
LDLIBS  += $(MPI_LIBS) -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas -lsentencepiece -lcjson -lpcre2-8 -lutf8proc -lcurl -lcrypto -lm -lstdc++ -fopenmp

DEB_PKGS = build-essential pkg-config libopenblas-openmp-dev libsentencepiece-dev sentencepiece \
           libcurl4-openssl-dev libssl-dev libopenmpi-dev openmpi-bin libcjson-dev libpcre2-dev libutf8proc-dev bats jq \
           python3 python3-venv python3-torch python3-numpy

LIB_C   := $(wildcard runtime/*.c kernels/cpu/*.c tokenizer/*.c generate/*.c train/*.c rlhf/*.c eval/*.c bench/*.c)
LIB_CXX := $(wildcard tokenizer/*.cpp)
LIB_OBJ := $(patsubst %.c,build/%.o,$(LIB_C)) $(patsubst %.cpp,build/%.o,$(LIB_CXX))
TEST_C  := $(wildcard tests/test_*.c)
TEST_BIN:= $(patsubst tests/%.c,build/tests/%,$(TEST_C))

.PHONY: all deps build run test cuda clean pyenv
all: deps
	@$(MAKE) --no-print-directory build
build: bin/tandem $(TEST_BIN)

# Installs only what is missing; a no-op when everything is present.
deps:
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  S=""; [ "$$(id -u)" = 0 ] || S=sudo; \
	  $$S apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$S apt-get install -y -qq $$missing; \
	fi

run: all
	@bash examples/run_default.sh

test: all pyenv
	@bash tests/run.sh

# Python for the reference checks: Debian's torch (system site packages) + pinned pip packages.
# Rebuilt when the requirements change; the versions found are written to .venv/versions.txt.
pyenv: .venv/stamp
.venv/stamp: eval/requirements.txt | deps
	@rm -rf .venv
	/usr/bin/python3 -m venv --system-site-packages .venv
	.venv/bin/pip install -q --disable-pip-version-check -r eval/requirements.txt
	@.venv/bin/python -c "import sys, torch, numpy, transformers; print(f'python {sys.version.split()[0]} torch {torch.__version__} numpy {numpy.__version__} transformers {transformers.__version__}')" | tee .venv/versions.txt
	@touch $@

build/%.o: %.c $(wildcard */*.h */*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@
# the CPU kernels: fused multiply-adds everywhere, the same way in every instantiation (see vec.h).
# GCC's Zen tuning otherwise leaves loop-carried multiply-add chains of <= 256 bits unfused, so
# one inlined copy of a dot product could round differently from another.
KERNEL_FLAGS := -ffp-contract=fast --param avoid-fma-max-bits=0 -Wno-psabi
build/kernels/cpu/%.o: kernels/cpu/%.c $(wildcard */*.h */*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(KERNEL_FLAGS) -c $< -o $@
build/%.o: %.cpp $(wildcard */*.h)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@
build/libtandem.a: $(LIB_OBJ)
	@rm -f $@; ar rcs $@ $^
bin/tandem: build/tandem.o build/libtandem.a
	@mkdir -p bin
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
build/tests/%: tests/%.c build/libtandem.a
	@mkdir -p build/tests
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# CUDA backend: kernels/cuda/*.cu, the kernels/cpu ones with a cuda_ prefix (see kernels/cuda/cuda.h).
CUDA_OBJ := $(patsubst %.cu,build/%.o,$(wildcard kernels/cuda/*.cu))
NVFLAGS  ?= -O2 -std=c++17 -I. -arch=sm_90 -Xcompiler -Wall,-Wextra
cuda: all
	@$(MAKE) --no-print-directory build/tests/cuda_vs_cpu
build/%.o: %.cu kernels/cuda/cuda.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@
build/tests/cuda_vs_cpu: tests/cuda/cuda_vs_cpu.c $(CUDA_OBJ) build/libtandem.a
	@mkdir -p build/tests
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcudart -lcublas -lstdc++

clean:
	rm -rf build bin
