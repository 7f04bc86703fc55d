# Tandem build. Public targets install missing Debian packages first (`deps`), then build.
#   make            build bin/tandem
#   make run        the main job on the default model (README)
#   make test       the whole suite (tests/run.sh); last line "N passed, N failed, N skipped"
#   make pyenv      the Python reference environment .venv/ (Debian's torch + eval/requirements*.txt)
#   make cuda       the same as make build (the CUDA backend is in every build where nvcc is found)
CC      ?= gcc
CXX     ?= g++
NVCC    ?= nvcc
OPT     ?= -O2 -march=native
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
# OpenBLAS's OpenMP build: it shares libgomp's thread pool with our kernels instead of fighting it
BLAS_DIR   := /usr/lib/x86_64-linux-gnu/openblas-openmp
BLAS_INC   := /usr/include/x86_64-linux-gnu/openblas-openmp
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)
CFLAGS  += -std=c11 -D_GNU_SOURCE $(OPT) -Wall -Wextra -Wpointer-arith -I. -Ibuild/gen -I$(BLAS_INC) $(MPI_CFLAGS) -fopenmp
CXXFLAGS+= -std=c++17 $(OPT) -Wall -Wextra -I.
LDLIBS  += $(MPI_LIBS) -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas -lsentencepiece -lcjson -lpcre2-8 -lutf8proc -lcurl -lcrypto -lprotobuf-c -lisal -lm -lstdc++ -fopenmp

DEB_PKGS = build-essential pkg-config libopenblas-openmp-dev libsentencepiece-dev sentencepiece \
           libcurl4-openssl-dev libssl-dev libopenmpi-dev openmpi-bin libcjson-dev libpcre2-dev libutf8proc-dev bats jq \
           protobuf-c-compiler libprotobuf-c-dev libisal-dev \
           iproute2 util-linux \
           python3 python3-venv python3-torch python3-numpy

LIB_C   := $(wildcard runtime/*.c kernels/cpu/*.c tokenizer/*.c generate/*.c train/*.c rlhf/*.c eval/*.c bench/*.c)
LIB_CXX := $(wildcard tokenizer/*.cpp)
# C made from the .proto files by protoc-c at build time (not committed: the generated code must match
# the installed libprotobuf-c, which checks its version against the generator's)
PROTO   := $(wildcard */*.proto)
GEN_C   := $(patsubst %.proto,build/gen/%.pb-c.c,$(PROTO))
LIB_OBJ := $(patsubst %.c,build/%.o,$(LIB_C)) $(patsubst %.cpp,build/%.o,$(LIB_CXX)) $(GEN_C:.c=.o)
TEST_C  := $(wildcard tests/test_*.c)
TEST_BIN:= $(patsubst tests/%.c,build/tests/%,$(TEST_C))
# The CUDA backend (kernels/cuda) is linked into every binary wherever nvcc is found (CI has nvcc,
# no GPU): as objects, not from the archive, since only a weak reference (backend_named) names it;
# without nvcc backend_named("cuda") is NULL and --device cuda says so. cudart is linked
# statically (no CUDA library is needed where the binary runs but the driver's libcuda).
NVCC_PATH := $(shell command -v $(NVCC) 2>/dev/null)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC_PATH))
ifneq ($(NVCC_PATH),)
CUDA_OBJ := $(patsubst %.cu,build/%.o,$(wildcard kernels/cuda/*.cu))
LDLIBS   += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread
TEST_BIN += build/tests/cuda_vs_cpu
endif
# sm_90 machine code (H100 / H200) plus compute_80 PTX the driver compiles for any newer GPU
NVFLAGS  ?= -O2 -std=c++20 -I. -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=compute_80 \
            -Xcompiler -Wall,-Wextra

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
.venv/stamp: eval/requirements.txt eval/requirements-nodeps.txt | deps
	@rm -rf .venv
	/usr/bin/python3 -m venv --system-site-packages .venv
	.venv/bin/pip install -q --disable-pip-version-check -r eval/requirements.txt
	.venv/bin/pip install -q --disable-pip-version-check --no-deps -r eval/requirements-nodeps.txt
	@.venv/bin/python -c "import sys, torch, numpy, transformers, peft; print(f'python {sys.version.split()[0]} torch {torch.__version__} numpy {numpy.__version__} transformers {transformers.__version__} peft {peft.__version__}')" | tee .venv/versions.txt
	@touch $@

build/%.o: %.c $(wildcard */*.h */*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@
# protoc-c: build/gen/DIR/NAME.pb-c.{c,h} from DIR/NAME.proto. Every object waits for the generated
# headers as for the written ones; named in these rules, make keeps them as the build's own files.
build/gen/%.pb-c.c build/gen/%.pb-c.h: %.proto
	@mkdir -p build/gen
	protoc-c --c_out=build/gen $<
$(GEN_C:.c=.o): build/gen/%.o: build/gen/%.c
	$(CC) $(CFLAGS) -c $< -o $@
$(LIB_OBJ) build/tandem.o: $(GEN_C:.c=.h)
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
bin/tandem: build/tandem.o $(CUDA_OBJ) build/libtandem.a
	@mkdir -p bin
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
build/tests/%: tests/%.c $(CUDA_OBJ) build/libtandem.a
	@mkdir -p build/tests
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

cuda: build
build/%.o: %.cu $(wildcard kernels/*.h kernels/cuda/*.h kernels/cuda/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@
# the oracle harness: tests/cuda/cuda_vs_cpu.c (main) and its files by entry family
build/tests/cuda_vs_cpu: $(wildcard tests/cuda/*.c) $(CUDA_OBJ) build/libtandem.a tests/cuda/cuda_vs_cpu.h
	@mkdir -p build/tests
	$(CC) $(CFLAGS) $(filter-out %.h,$^) -o $@ $(LDLIBS)

clean:
	rm -rf build bin
