#!/usr/bin/env bash
# The layering checker must catch what it claims to: a checker that passed every tree would keep
# the layering test green forever. Builds fake src/ trees in a temporary folder, each breaking one
# rule, and holds the checker to naming every offence by file:line -- and to passing a tree that
# breaks none (a checker that failed everything would be no better).
#
# usage: layering_selftest.sh PATH/TO/layering_test.sh
set -u
checker=${1:?usage: layering_selftest.sh LAYERING_TEST_SH}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
src=$tmp/src
failures=0

put() {  # put PATH LINE... : writes a file of the fake tree, one argument per line
  local f=$src/$1
  shift
  mkdir -p "$(dirname "$f")"
  printf '%s\n' "$@" >"$f"
}

expect() {  # expect WHAT EXIT_CODE [TEXT...]: the last run exited so and printed every TEXT
  local what=$1 code=$2
  shift 2
  if [[ $rc != "$code" ]]; then
    echo "FAIL: $what: exit $rc, expected $code"
    failures=$((failures + 1))
  fi
  for t in "$@"; do
    if [[ $out != *"$t"* ]]; then
      echo "FAIL: $what: output lacks '$t'"
      failures=$((failures + 1))
    fi
  done
}

run() {
  out=$(bash "$checker" "$@" 2>&1)
  rc=$?
}

# A tree that keeps every rule, with the shapes the real one has: a backend named inside ep/ (and a
# subfolder of it), CUDA sources in a layer's subfolder, an include next to the file, an include
# of a header that is not in src/.
put util/error.h '#pragma once'
put tensor/view.h '#pragma once' '#include "util/error.h"'
put comm/group.h '#pragma once' '#include <vector>' '#include "util/error.h"'
put kernels/matmul.h '#pragma once' '#include "tensor/view.h"'
put ep/backend.h '#pragma once' '#include "comm/group.h"' 'enum class BackendKind { AllToAll };'
put ep/nccl/alltoall.cu '#include "ep/backend.h"' '#include "kernels/matmul.h"' 'auto b = make_nccl_alltoall_backend();'
put moe/layer.h '#pragma once' '#include "ep/backend.h"' '#include "kernels/matmul.h"'
put moe/layer.cc '#include "moe/layer.h"' '#include "detail.h"' '#include "nlohmann/json.hpp"'
put moe/detail.h '#pragma once'
put model/cuda/decoder.cuh '#pragma once' '#include "moe/layer.h"' '#include "model/cuda/attn.cuh"'
put model/cuda/attn.cuh '#pragma once' '#include "kernels/matmul.h"'
put engine/loop.cc '#include "model/cuda/decoder.cuh"' '#include "comm/group.h"'
put cli/main.cc '#include "engine/loop.cc"' '// all-to-all is a word of the prose, not a backend'
# The one decoder loop and the one MoE block, where they belong; a loop over the layers that
# calls neither (weight loading) anywhere.
put model/decoder.h '#pragma once' 'template <class Ops> void run(Ops& ops) {' \
  '  for (int l = 0; l < cfg.num_layers; l++) {' '    ops.attention(l);' '    ops.moe(l);' '  }' '}'
put moe/moe_block.h '#pragma once' '#include "ep/backend.h"' 'backend.run(ops.tokens(), ops.experts(), ops.routed());'
put moe/cuda/ops.cuh '#pragma once' '#include "ep/backend.h"' 'MoeTokens tokens() const;'
put model/weights.cc 'void load() {' '  for (int l = 0; l < c.num_layers; l++) {' '    L.attn = read(l);' '    L.moe = read(l);' '  }' '}'

run "$src"
expect "a tree that keeps the rules" 0 "layering ok"

run --graph "$src"
expect "--graph" 0 "model -> moe" "engine -> comm" "ep -> comm"
[[ $out == *"not allowed"* ]] && { echo "FAIL: --graph marks an allowed edge"; failures=$((failures + 1)); }

# Now break the rules, one offence per file, each where an exemption used to hide or could hide.
put kernels/rope.cc '#include "kernels/matmul.h"' '#include "moe/layer.h"'                  # upward, line 2
put model/cuda/decoder.cu '#include "model/cuda/decoder.cuh"' 'if (k == BackendKind::AllToAll) {}'  # backend, line 2
put model/cuda/rank.cuh '#pragma once' '' '#include "comm/group.h"'                        # model -> comm, line 3
put moe/ranks.h '#include "comm/group.h"'                                                   # moe -> comm, line 1
put kernels/cuda/reduce.cuh '#include "comm/group.h"'                                       # kernels -> comm, line 1
put cli/gpu.cc '#include "cuda/run.h"'                                                      # not a layer
put cuda/run.h '#pragma once'
put check/pick.cc 'auto b = make_mpi_lowlatency_backend();' 'if (name == "x") traits_of(x);'   # backend, lines 1-2
put model/cuda/step.cu 'void body() {' '  for (int l = 0; l < cfg.num_layers; l++) {' '    norm(l);' \
  '    attention_block(l);' '    mlp(l, T, backend);' '  }' '}'                              # a second loop, line 2
put model/cuda/mlp.cu 'void mlp() {' '  MoeTokens tok;' '  backend.run(tok, *L.runner, out);' '}'  # MoE block, lines 2-3

run "$src"
expect "a tree that breaks the rules" 1 \
  "src/kernels/rope.cc:2: upward include: kernels may not include moe" \
  "src/model/cuda/decoder.cu:2: names a backend outside src/ep/ (AllToAll,BackendKind)" \
  "src/model/cuda/rank.cuh:3: model may not include comm (the model never talks to other ranks" \
  "src/moe/ranks.h:1: moe may not include comm" \
  "src/kernels/cuda/reduce.cuh:1: upward include: kernels may not include comm" \
  "src/cli/gpu.cc:1: cli includes src/cuda/, which is not a layer" \
  "src/cuda/run.h:1: src/cuda/ is not a layer" \
  "src/check/pick.cc:1: names a backend outside src/ep/ (make_mpi_lowlatency_backend)" \
  "src/check/pick.cc:2: names a backend outside src/ep/ (traits_of)" \
  "src/model/cuda/step.cu:2: a second decoder layer loop" \
  "src/model/cuda/mlp.cu:2: builds the backend's input outside src/ep/, src/check/, src/moe/" \
  "src/model/cuda/mlp.cu:3: runs a backend outside the one MoE block"
offences=$(grep -c '^src/' <<<"$out")
[[ $offences == 12 ]] || { echo "FAIL: $offences offences reported, expected 12:"; echo "$out"; failures=$((failures + 1)); }

run --graph "$src"
expect "--graph of the broken tree" 0 "kernels -> moe" "model -> comm" "cuda"
grep -q 'kernels -> moe .*(not allowed)' <<<"$out" || { echo "FAIL: --graph does not mark kernels -> moe"; failures=$((failures + 1)); }

if ((failures)); then
  echo "layering checker self-test: $failures failure(s); last output:"
  echo "$out"
  exit 1
fi
echo "layering checker self-test ok"
