#!/usr/bin/env bash
# The one place that lists epmoe's packages (Debian). Installs only what is missing, so it is
# cheap to run before every build. Needs root (or sudo) only when something is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake pkg-config
  nlohmann-json3-dev libcli11-dev
  libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libbenchmark-dev
  libpcre2-dev libutf8proc-dev
  libcpp-httplib-dev               # epmoe serve: HTTP (cpp-httplib)
  libssl-dev                       # epmoe serve: base64 of routed_experts (OpenSSL's encoder)
  python3-httpx python3-aiohttp    # tests/serve: the Python clients of RL frameworks (slime, AReaL)
  nodejs                           # tests/serve: the OpenAI client (npm `openai` v6, below)
  libopenblas-dev
  python3
  clang libclang-rt-14-dev llvm   # scripts/fuzz.sh: libFuzzer with ASan + UBSan, llvm-symbolizer
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm comes with NodeSource's nodejs; Debian's nodejs needs its npm package.
command -v npm >/dev/null 2>&1 || missing+=(npm)
if ((${#missing[@]} > 0)); then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The test clients from npm, at the versions package-lock.json pins (tests/serve/clients): the
# OpenAI SDK and the Vercel AI SDK that test `epmoe serve` as applications would. Installed once
# into that folder.
clients=tests/serve/clients
installed_as_locked() {
  (cd "$clients" && node -e '
    const lock = require("./package-lock.json").packages;
    for (const [path, p] of Object.entries(lock))
      if (path && require("./" + path + "/package.json").version !== p.version) process.exit(1);' 2>/dev/null)
}
if ! installed_as_locked; then
  echo "install-deps: npm ci in $clients" >&2
  (cd "$clients" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
