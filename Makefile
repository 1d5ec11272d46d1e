# mnemo — build, test and benchmark.
#
#   make            release build: build/release/mnemo (and ./mnemo link)
#   make test       set-up, the layering check, then unit + integration tests in
#                   the release build and again under AddressSanitizer + UBSan
#                   (builds on JOBS cores, default all)
#   make check-layers  includes against docs/DESIGN.md's layer tables (and a
#                   self-test that it catches a violation)
#   make run        set-up, build, and a generation with the bundled demo model
#   make bench      performance figures (see README)
#   make fuzz       each libFuzzer target (fuzz/fuzz_*.c) for FUZZ_SECONDS (60)
#   make install    PREFIX=/usr/local DESTDIR= : bin/mnemo, share/mnemo/

# `make` alone builds `all`, whatever rule the variant macro expands first.
.DEFAULT_GOAL := all

CC      ?= gcc
# The flags below come from pkg-config when make reads this file, so a rule
# that runs scripts/setup first (test, run, bench) builds in a sub-make that
# reads it again after the packages are installed.
PKGS    := libpcre2-8 libxxhash jansson libmicrohttpd libcurl liburing sqlite3 libedit hiredis
WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wno-unused-parameter
BASE    := -std=c17 -ffp-contract=off -D_GNU_SOURCE -Isrc -Itests -pthread $(WARN) $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LIBS    := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lm -pthread
TESTLIBS:= -lcmocka

REL_CFLAGS  := $(BASE) -O3 -march=native -DNDEBUG -g
ASAN_CFLAGS := $(BASE) -O1 -march=native -g -fno-omit-frame-pointer \
               -fsanitize=address,undefined -fno-sanitize-recover=all
# The other SIMD paths of the kernels, tested on this machine too: plain C
# (no -march) and AVX2 without AVX-512.
SCALAR_CFLAGS := $(BASE) -O2 -g
AVX2_CFLAGS   := $(BASE) -O2 -g -march=native -mno-avx512f

LIB_SRC  := $(filter-out src/main.c src/base/version.c,$(wildcard src/*/*.c))
TEST_SRC := $(wildcard tests/test_*.c)

# The build's commit, compiled into base/version.c alone (the version number
# itself is MNEMO_VERSION in src/base/version.h). build/commit holds the hash
# and is rewritten only when HEAD has moved, so a new commit recompiles
# version.o and relinks mnemo, nothing else. The tests link version.o too,
# as an order-only prerequisite: a new commit does not relink them (they
# run the mnemo binary to check what it reports).
COMMIT := $(shell [ -e .git ] && git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)

define variant
$(1)_DIR  := build/$(1)
$(1)_OBJ  := $$(patsubst src/%.c,build/$(1)/obj/%.o,$$(LIB_SRC))
$(1)_TESTS:= $$(patsubst tests/%.c,build/$(1)/tests/%,$$(TEST_SRC))

$(1)_VERSION := build/$(1)/obj/base/version.o

build/$(1)/obj/%.o: src/%.c
	@mkdir -p $$(dir $$@)
	$$(CC) $$($(2)) -MMD -MP -c $$< -o $$@

$$($(1)_VERSION): src/base/version.c build/commit
	@mkdir -p $$(dir $$@)
	$$(CC) $$($(2)) -DMNEMO_COMMIT='"$$(COMMIT)"' -MMD -MP -c $$< -o $$@

build/$(1)/libmnemo.a: $$($(1)_OBJ)
	@rm -f $$@
	ar rcs $$@ $$^

build/$(1)/mnemo: src/main.c build/$(1)/libmnemo.a $$($(1)_VERSION)
	$$(CC) $$($(2)) -MMD -MP $$< build/$(1)/libmnemo.a $$($(1)_VERSION) $$(LIBS) -o $$@

build/$(1)/tests/%: tests/%.c build/$(1)/libmnemo.a $$(wildcard tests/*.h) | $$($(1)_VERSION)
	@mkdir -p $$(dir $$@)
	$$(CC) $$($(2)) -MMD -MP $$< build/$(1)/libmnemo.a $$($(1)_VERSION) $$(LIBS) $$(TESTLIBS) -o $$@

-include $$(patsubst %.o,%.d,$$($(1)_OBJ) $$($(1)_VERSION))
endef

$(eval $(call variant,release,REL_CFLAGS))
$(eval $(call variant,asan,ASAN_CFLAGS))
$(eval $(call variant,scalar,SCALAR_CFLAGS))
$(eval $(call variant,avx2,AVX2_CFLAGS))

# ---- fuzzing: a libFuzzer target per fuzz/fuzz_NAME.c, built with clang ----
# The library is compiled again with coverage instrumentation and ASan+UBSan.
# clang warns about a few things gcc does not; in the library those stay
# warnings here (the gcc builds above are the -Werror gate), the targets'
# own files are compiled with -Werror.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_CFLAGS  := $(filter-out -Werror,$(BASE)) -O1 -g -fno-omit-frame-pointer \
                -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
FUZZ_BINS    := $(patsubst fuzz/%.c,build/fuzz/%,$(wildcard fuzz/fuzz_*.c))
fuzz_OBJ     := $(patsubst src/%.c,build/fuzz/obj/%.o,$(LIB_SRC))

build/fuzz/obj/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@

build/fuzz/libmnemo.a: $(fuzz_OBJ)
	@rm -f $@
	ar rcs $@ $^

fuzz_VERSION := build/fuzz/obj/base/version.o

$(fuzz_VERSION): src/base/version.c build/commit
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -DMNEMO_COMMIT='"$(COMMIT)"' -MMD -MP -c $< -o $@

build/fuzz/fuzz_%: fuzz/fuzz_%.c build/fuzz/libmnemo.a | $(fuzz_VERSION)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -Werror -fsanitize=fuzzer -MMD -MP $< build/fuzz/libmnemo.a $(fuzz_VERSION) $(LIBS) -o $@

-include $(patsubst %.o,%.d,$(fuzz_OBJ) $(fuzz_VERSION))

# kernel tests that also run in the scalar and AVX2 builds
KERNEL_TESTS := test_matmul test_attention test_forward

build/commit: FORCE
	@mkdir -p build
	@echo '$(COMMIT)' | cmp -s - $@ || echo '$(COMMIT)' > $@

.PHONY: FORCE all setup check-layers test test-release test-paths test-asan run bench install uninstall clean fuzz fuzz-build
all: build/release/mnemo
	@ln -sf build/release/mnemo mnemo

setup:
	@./scripts/setup

check-layers:
	@./scripts/check-layers
	@./scripts/check-layers --self-test

# make test builds on JOBS cores (default: all of them); the tests run one
# binary at a time.
JOBS ?= $(shell nproc 2>/dev/null || echo 1)

test: setup
	$(MAKE) check-layers
	$(MAKE) -j$(JOBS) test-release
	$(MAKE) -j$(JOBS) test-paths
	$(MAKE) -j$(JOBS) test-asan

test-release: build/release/mnemo $(release_TESTS)
	@./tests/run.sh build/release

test-paths: $(addprefix build/scalar/tests/,$(KERNEL_TESTS)) $(addprefix build/avx2/tests/,$(KERNEL_TESTS))
	@MNEMO_TESTS="$(KERNEL_TESTS)" ./tests/run.sh build/scalar
	@MNEMO_TESTS="$(KERNEL_TESTS)" ./tests/run.sh build/avx2

test-asan: build/asan/mnemo $(asan_TESTS)
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  MNEMO_SANITIZED=1 ./tests/run.sh build/asan

# make fuzz [FUZZ_SECONDS=60]: every fuzz target for FUZZ_SECONDS seconds
# (scripts/fuzz: corpora, dictionaries, and how findings are reported).
fuzz-build: $(FUZZ_BINS)

fuzz: setup
	@$(MAKE) --no-print-directory -j$(JOBS) fuzz-build
	@./scripts/fuzz $(FUZZ_SECONDS) $(FUZZ_BINS)

run: setup
	@$(MAKE) --no-print-directory all
	@echo "mnemo: starting the server on the demo model; in another terminal try:"
	@echo "  curl -s http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\"
	@echo "    -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time\"}], \"max_tokens\": 64}'"
	./build/release/mnemo serve -m models/stories260K.gguf

bench: setup
	@$(MAKE) --no-print-directory all
	./scripts/bench

# make install [PREFIX=/usr/local] [DESTDIR=staging]: the binary, and the
# demo model under share/mnemo. The binary is built for this machine's CPU
# (-march=native): install it on the machine that built it.
PREFIX  ?= /usr/local
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/mnemo
	install -m 0755 build/release/mnemo $(DESTDIR)$(PREFIX)/bin/mnemo
	install -m 0644 models/stories260K.gguf $(DESTDIR)$(PREFIX)/share/mnemo/stories260K.gguf

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/mnemo $(DESTDIR)$(PREFIX)/share/mnemo/stories260K.gguf
	-rmdir $(DESTDIR)$(PREFIX)/share/mnemo

clean:
	rm -rf build mnemo
