#!/usr/bin/env bash
# The layer rules of ARCHITECTURE.md, checked on every source of src/ (.cc .h .cu .cuh, CUDA
# sources and subfolders included), with no exemption:
#   1. outside src/ep/ no code names an all-to-all backend: the MoE layer and the models must not
#      be able to branch on which backend runs;
#   2. a file under src/Y/ includes only Y itself and the layers Y may use (the table below);
#   3. only src/util/env.cc reads the environment (its table lists every variable), and
#      docs/ARCHITECTURE.md names every variable of that table;
#   4. one decoder loop and one MoE block for every device: a loop over the layers that calls an
#      attention phase and an MLP/MoE phase lives in src/model/decoder.h only; the backend's input
#      (MoeTokens) is named only in src/ep/, src/check/ and src/moe/, and a backend is run with it
#      only in src/moe/moe_block.h.
# Every offence is printed as file:line with the rule it breaks; exit 1 on any.
#
# usage: layering_test.sh SRC_DIR           check
#        layering_test.sh --graph SRC_DIR   print the include graph by folder ("Y -> X  count")
set -u

graph=0
if [[ ${1:-} == --graph ]]; then
  graph=1
  shift
fi
src=${1:?usage: layering_test.sh [--graph] SRC_DIR}
src=${src%/}

# ---- the rules, as data ----

# What each layer may include besides itself: every layer below it in the order
#   cli, check | serve, engine, model, moe, ep, comm, kernels, tokenizer, io, tensor, util
# less the edges that WHY explains. A folder of src/ missing here is not a layer, and is an offence.
read -r -d '' ALLOWED <<'EOF'
cli        serve check engine model moe ep comm kernels tokenizer io tensor util
check      engine model moe ep comm kernels tokenizer io tensor util
serve      engine model moe ep comm kernels tokenizer io tensor util
engine     model moe ep comm kernels tokenizer io tensor util
model      moe ep kernels tokenizer io tensor util
moe        ep kernels tokenizer io tensor util
ep         comm kernels tokenizer io tensor util
comm       kernels tokenizer io tensor util
kernels    tokenizer io tensor util
tokenizer  io tensor util
io         tensor util
tensor     util
util
EOF

# Edges the order alone would allow and the table leaves out, and why. The model and the MoE layer
# never talk to other ranks: all cross-rank arithmetic lives behind the backend interface (ep/),
# and the lockstep loop in engine/. A model that could reach the group could reduce across ranks
# itself -- the double reduce this project exists to make impossible. (kernels cannot reach the
# group either: comm is above them in the order.)
declare -A WHY=(
  [model:comm]="the model never talks to other ranks; only backends (ep) and the engine do"
  [moe:comm]="the MoE layer never talks to other ranks; only backends (ep) and the engine do"
)

# Words that name a backend or its factory; only src/ep/ may use them.
backend_words='alltoall|lowlatency|onesided|AllToAll|LowLatency|OneSided|BackendKind|traits_of|make_(none|alltoall|lowlatency|onesided|fused)_backend|make_(mpi|nccl)_\w+_backend'

declare -A may rank_of
order=()
while read -r layer deps; do
  [[ -z $layer ]] && continue
  order+=("$layer")
  rank_of[$layer]=${#order[@]}
  may[$layer]=" $layer $deps "
done <<<"$ALLOWED"

sources() { find "$src" -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort; }

# The layer of a path under $src: its first component.
layer_of() {
  local rel=${1#"$src"/}
  [[ $rel == */* ]] && echo "${rel%%/*}" || echo ""
}

# The layer an #include "P" of file F reaches, or "" when P is not a file of src/ (a system or
# third-party header). A path that starts with a layer's name is that layer even when the file is
# missing; otherwise P is looked up as the compiler does: next to F first, then in src/.
target_of() {
  local f=$1 p=$2 first=${2%%/*}
  if [[ $p == */* && -n ${may[$first]:-} ]]; then
    echo "$first"
  elif [[ -e $(dirname "$f")/$p ]]; then
    local real
    real=$(realpath -m "$(dirname "$f")/$p")
    [[ $real == "$(realpath -m "$src")"/* ]] && layer_of "$src/${real#"$(realpath -m "$src")"/}" || echo ""
  elif [[ -e $src/$p ]]; then
    layer_of "$src/$p"
  else
    echo ""
  fi
}

# ---- one pass over every include ----

fail=0
declare -A edges
report() {  # file line rule text
  echo "src/${1#"$src"/}:$2: $3: $4"
  fail=1
}

include_re='^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)"'
while IFS= read -r f; do
  y=$(layer_of "$f")
  # Includes of a file outside the layers cannot be judged; the file itself is the offence.
  if [[ -z $y || -z ${may[$y]:-} ]] && ((!graph)); then
    where=${y:+src/$y/ is not a layer}
    report "$f" 1 "${where:-not in a layer folder} (the layers: ${order[*]})" "move it into one"
  fi
  while IFS=: read -r line text; do
    [[ $text =~ $include_re ]] || continue
    x=$(target_of "$f" "${BASH_REMATCH[1]}")
    [[ -z $x ]] && continue
    [[ $x != "$y" ]] && edges["${y:-src} -> $x"]=$((${edges["${y:-src} -> $x"]:-0} + 1))
    ((graph)) || [[ -z $y || -z ${may[$y]:-} ]] && continue
    if [[ -z ${may[$x]:-} ]]; then
      report "$f" "$line" "$y includes src/$x/, which is not a layer" "$text"
    elif [[ ${may[$y]} != *" $x "* ]]; then
      if [[ -n ${WHY[$y:$x]:-} ]]; then
        rule="$y may not include $x (${WHY[$y:$x]})"
      elif ((rank_of[$x] < rank_of[$y])); then
        rule="upward include: $y may not include $x, a layer above it"
      else
        rule="$y may not include $x (it may include:${may[$y]# $y})"
      fi
      report "$f" "$line" "$rule" "$text"
    fi
  done < <(grep -nE "$include_re" "$f")
done < <(sources)

if ((graph)); then
  # Edges a check would reject are marked, so the graph doubles as the to-do list.
  for e in "${!edges[@]}"; do
    y=${e%% -> *} x=${e##* -> }
    mark=""
    [[ -z ${may[$y]:-} || ${may[$y]} != *" $x "* ]] && mark="  (not allowed)"
    printf '%s\t%s\t%-22s %4d%s\n' "${rank_of[$y]:-99}" "${rank_of[$x]:-99}" "$e" "${edges[$e]}" "$mark"
  done | sort -t$'\t' -k1,1n -k2,2n -k3,3 | cut -f3-
  exit 0
fi

# grep -n over every source of src/ (the pattern and grep's flags given).
grep_src() { grep -rn "$@" "$src" --include='*.cc' --include='*.h' --include='*.cu' --include='*.cuh'; }
# Each "file:line:text" hit of stdin is an offence against rule $1.
report_hits() {
  local rule=$1 hit f rest
  while IFS= read -r hit; do
    [[ -z $hit ]] && continue
    f=${hit%%:*} rest=${hit#*:}
    report "$f" "${rest%%:*}" "$rule" "${rest#*:}"
  done
}

# ---- backend names outside src/ep/ ----

while IFS= read -r hit; do
  [[ -z $hit ]] && continue
  f=${hit%%:*} rest=${hit#*:}
  line=${rest%%:*} text=${rest#*:}
  words=$(grep -owE "$backend_words" <<<"$text" | sort -u | paste -sd, -)
  report "$f" "$line" "names a backend outside src/ep/ ($words)" "$text"
done < <(grep_src -wE "$backend_words" | grep -v "^$src/ep/")

# ---- environment variables: read through util/env.cc's table only, every entry documented ----

report_hits "reads the environment outside util/env.cc (add the variable to its table, read it with env_get)" \
  < <(grep_src -E '\b(std::)?(getenv|secure_getenv)\(' | grep -v "^$src/util/env.cc:")
doc=$src/../docs/ARCHITECTURE.md
if [[ -f $src/util/env.cc && -f $doc ]]; then
  while IFS= read -r name; do
    grep -q "\`$name\`" "$doc" ||
      report "$src/util/env.cc" 0 "$name is in the table but docs/ARCHITECTURE.md (Environment variables) does not list it" ""
  done < <(grep -oE '^\s*\{"[A-Z_]+",' "$src/util/env.cc" | grep -oE '[A-Z_]+')
fi

# ---- one decoder loop, one MoE block ----

# A `for` over num_layers whose next 12 lines call both an attention phase and an MLP/MoE phase.
report_hits "a second decoder layer loop (the one loop is run_decoder_layers in src/model/decoder.h; give it this device's phases)" \
  < <(sources | grep -v "^$src/model/decoder.h$" | while IFS= read -r f; do
    awk -v f="$f" '
      /for[[:space:]]*\(.*num_layers/ { start = FNR; text = $0; att = 0; mlp = 0 }
      start && FNR - start <= 12 {
        if (tolower($0) ~ /[a-z_]*attention[a-z_]*[[:space:]]*\(/) att = 1
        if (tolower($0) ~ /[a-z_]*(mlp|moe)[a-z_]*[[:space:]]*\(/) mlp = 1
        if (att && mlp) { print f ":" start ":" text; start = 0 }
      }' "$f"
  done)

report_hits "builds the backend's input outside src/ep/, src/check/, src/moe/ (the MoE block is src/moe/moe_block.h's)" \
  < <(grep_src -w 'MoeTokens' | grep -vE "^$src/(ep|check|moe)/")

report_hits "runs a backend outside the one MoE block (src/moe/moe_block.h run_moe_block)" \
  < <(grep_src -E '(\.|->)run\([[:space:]]*(tok\b|[A-Za-z_]+\.tokens\(\))' | grep -vE "^$src/(ep|check)/|^$src/moe/moe_block.h:")

if ((fail)); then
  echo "layering broken: see the lines above (rules: tests/layering_test.sh)"
  exit 1
fi
echo "layering ok"
