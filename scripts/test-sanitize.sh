#!/usr/bin/env bash
# The whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer: builds with
# -DEPMOE_SANITIZE=ON into build-asan/ and runs ctest there, the mpirun tests included. Any
# out-of-bounds access, use after free, leak or undefined behaviour fails the test that hit it
# (UB aborts: the build uses -fno-sanitize-recover). Extra args go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Release -DEPMOE_SANITIZE=ON -DEPMOE_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j"$(nproc)"

if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
asan="detect_leaks=1:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"
export ASAN_OPTIONS="$asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# tests/lsan.supp holds the only suppressions: allocations that Open MPI's libraries make at
# start-up and never free (not ours; see the file). Matching them needs full allocation stacks
# (Open MPI is built without frame pointers), and the slow unwinder that gives them costs 5x on
# every malloc -- so only ranks started by mpirun get it, through Open MPI's list of variables
# it sets for the processes it launches.
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
export OMPI_MCA_mca_base_env_list="ASAN_OPTIONS=$asan:fast_unwind_on_malloc=0"
cd build-asan
ctest --output-on-failure -j"$(nproc)" "$@"
