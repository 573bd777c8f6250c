#!/usr/bin/env bash
# Builds the pinned upstream binaries of wok's test cluster from the Go module proxy:
#   kube-apiserver, kube-controller-manager, kube-scheduler (k8s.io/kubernetes), kubectl, etcd, kwok, helm,
#   prometheus (Debian's package is built without Kubernetes service discovery), and KEDA's
#   operator and metrics adapter (with the release's config/: CRDs, RBAC, into keda-config/).
# Each tool is a tiny Go module under cluster/go/<name>/ whose committed go.mod and go.sum pin
# every dependency, so a build is reproducible. Binaries land in ~/.cache/wok/bin/<k8s version>/.
# A second run only hashes the modules and returns (seconds): a tool is rebuilt only when its
# go.mod/go.sum changed or its binary is missing.
#
# Usage: cluster/build.sh [--print-bin-dir]    WOK_CACHE overrides ~/.cache/wok.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mods="$here/go"
go_bin="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
k8s_version="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$mods/kubernetes/go.mod")"
bin_dir="${WOK_CACHE:-$HOME/.cache/wok}/bin/$k8s_version"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
  echo "$bin_dir"
  exit 0
fi

# <module dir> <binary> <package>; sequential on purpose: one k8s link step needs GBs of memory.
tools=(
  "kubernetes kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver"
  "kubernetes kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager"
  "kubernetes kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler"
  "kubectl kubectl wok.dev/cluster/kubectl"
  "etcd etcd go.etcd.io/etcd/server/v3"
  "kwok kwok sigs.k8s.io/kwok/cmd/kwok"
  "helm helm helm.sh/helm/v3/cmd/helm"
  "prometheus prometheus github.com/prometheus/prometheus/cmd/prometheus"
  "keda keda-operator github.com/kedacore/keda/v2/cmd/operator"
  "keda keda-adapter github.com/kedacore/keda/v2/cmd/adapter"
)

# Version stamps the upstream release builds set with -X (hack/lib/version.sh); without them the
# apiserver reports v0.0.0-master and clients that check the server version (helm kubeVersion)
# refuse it.
module_version() { awk -v m="$2" '$1 == "require" && $2 == m {print $3}' "$mods/$1/go.mod"; }
x_flags() {
  case "$1" in
    kubernetes | kubectl)
      local major minor pkg=k8s.io/component-base/version
      IFS=. read -r major minor _ <<<"${k8s_version#v}"
      echo "-X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor" \
        "-X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
      ;;
    helm) echo "-X helm.sh/helm/v3/internal/version.version=$(module_version helm helm.sh/helm/v3)" ;;
    prometheus)
      # module v0.305.0 is Prometheus 3.5.0
      local v
      v="$(module_version prometheus github.com/prometheus/prometheus)"
      v="${v#v0.}"
      echo "-X github.com/prometheus/common/version.Version=${v:0:1}.$((10#${v:1:2})).${v#*.}"
      ;;
    keda)
      local v
      v="$(module_version keda github.com/kedacore/keda/v2)"
      echo "-X github.com/kedacore/keda/v2/version.Version=${v#v}"
      ;;
    *) echo "" ;;
  esac
}

# Prometheus: only the Kubernetes SD plugin (the cloud SDs would triple the build time)
build_tags() {
  case "$1" in
    prometheus) echo "remove_all_sd,enable_kubernetes_sd" ;;
    *) echo "" ;;
  esac
}

if [[ ! -x "$go_bin" ]]; then
  echo "build.sh: no Go toolchain (looked for \$GO, go on PATH, /usr/local/go/bin/go)" >&2
  exit 1
fi

# The proxy is the only network source; the committed go.sum is the integrity check (the checksum
# database is not reachable from every machine this runs on). GOTOOLCHAIN=local: never download Go.
export GOPROXY="${GOPROXY:-https://proxy.golang.org}" GOSUMDB=off GOFLAGS=-mod=mod \
  GOTOOLCHAIN=local CGO_ENABLED=0

# what a binary was built from: its module's go.mod and go.sum (go.sum is absent before the first
# build of a newly added tool)
# (and the -X version flags)
module_hash() {
  { cat "$mods/$1/go.mod" "$mods/$1/go.sum" 2>/dev/null; x_flags "$1"; build_tags "$1"; } | sha256sum | cut -d' ' -f1
}

mkdir -p "$bin_dir"
# one build at a time (a test session may call this while `make cluster-bin` runs)
exec 9>"$bin_dir/.lock"
flock 9
start_all=$SECONDS
built=()
failed=()
echo "[wok build] Go $("$go_bin" env GOVERSION), binaries in $bin_dir"
for entry in "${tools[@]}"; do
  read -r mod name pkg <<<"$entry"
  stamp="$bin_dir/.$name.stamp"
  want="$(module_hash "$mod")"
  if [[ -x "$bin_dir/$name" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "[wok build] $name: up to date"
    continue
  fi
  echo "[wok build] $name: building $pkg ..."
  t0=$SECONDS
  # a failed tool does not stop the others (nor their stamps): KEDA, built last, is only needed
  # by its own tests; the run still fails at the end and names it
  if ! (cd "$mods/$mod" &&
    "$go_bin" build -trimpath -tags="$(build_tags "$mod")" -ldflags="-s -w $(x_flags "$mod")" -o "$bin_dir/$name.tmp" "$pkg"); then
    failed+=("$name")
    echo "[wok build] $name: FAILED after $((SECONDS - t0))s" >&2
    continue
  fi
  mv -f "$bin_dir/$name.tmp" "$bin_dir/$name"
  built+=("$mod $name")
  echo "[wok build] $name: built in $((SECONDS - t0))s"
done
# stamp after all builds: a later tool of the same module may still have completed its go.sum
for entry in "${built[@]}"; do
  read -r mod name <<<"$entry"
  module_hash "$mod" >"$bin_dir/.$name.stamp"
done

# KEDA's CRDs and RBAC manifests come from the release its binaries were built from: its config/
# is copied out of the module cache next to the binaries, so a run needs neither Go nor the cache.
keda_version="$(module_version keda github.com/kedacore/keda/v2)"
keda_config="$bin_dir/keda-config"
if [[ "$(cat "$keda_config/.version" 2>/dev/null)" != "$keda_version" ]]; then
  if keda_dir="$(cd "$mods/keda" && "$go_bin" mod download github.com/kedacore/keda/v2 &&
    "$go_bin" list -m -f '{{.Dir}}' github.com/kedacore/keda/v2)"; then
    rm -rf "$keda_config" "$keda_config.tmp"
    cp -r --no-preserve=mode "$keda_dir/config" "$keda_config.tmp"
    echo "$keda_version" >"$keda_config.tmp/.version"
    mv "$keda_config.tmp" "$keda_config"
    echo "[wok build] keda-config: KEDA $keda_version's config/ (CRDs, RBAC)"
  else
    failed+=("keda-config")
  fi
fi
if ((${#failed[@]})); then
  echo "[wok build] FAILED: ${failed[*]} (the others are built)" >&2
  exit 1
fi
echo "[wok build] done in $((SECONDS - start_all))s"
