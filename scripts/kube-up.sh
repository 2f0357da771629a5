#!/usr/bin/env bash
# Bring up a real Kubernetes API server for the operator tests, as root, without systemd, Docker or a kubelet:
# etcd + kube-apiserver on 127.0.0.1 with TLS (self-signed CA made here), RBAC, a static admin token and
# service-account tokens (TokenRequest: `kubectl create token SA`). No controller-manager or scheduler runs.
# Idempotent: builds the binaries only when their cache is missing or stale, starts only what is not running,
# and returns at once when everything is already up.
#
# Usage: scripts/kube-up.sh        then: source "$KUBE_LAB/env.sh"   (exports KUBECONFIG, PATH with kubectl)
# Env:   KUBE_LAB        state dir (default /tmp/evalrun-kube): pki/, etcd/ data, log/, pids/, kubeconfig, env.sh
#        KUBE_LAB_CACHE  binary cache (default /var/cache/evalrun-kube): <stamp dir>/bin/{kube-apiserver,kubectl,etcd}
#        KUBE_PORT       API server port on 127.0.0.1 (default 6443)
#        KUBE_ETCD_PORT  etcd client port on 127.0.0.1 (default 2379); its peer port is +1
#        KUBE_GOFLAGS    extra GOFLAGS for the build (e.g. -p=1 to build one package at a time)
# Build: build/kube/go.mod pins k8s.io/kubernetes and its staging modules; the stamp records the versions,
#        the Go toolchain and the hashes of go.mod/go.sum, so a change of any of them rebuilds (once per machine).
# Files: $KUBE_LAB/kubeconfig (admin, token auth), $KUBE_LAB/pki/admin.token, $KUBE_LAB/pki/ca.crt
# Stop:  scripts/kube-down.sh [--purge]   (also before changing KUBE_PORT / KUBE_ETCD_PORT of a running lab)
# Times here (2 cores): cold build ~21 min wall while another test suite ran (~17 CPU-min; plus ~30 s of module
#        downloads on a machine without them; a rebuild with Go's build cache warm: 15-30 s); up from the binary
#        cache 4-6 s (5-10 s with a fresh $KUBE_LAB: new keys); already up ~0.15 s. The API server uses ~270 MB RSS,
#        etcd ~40 MB; the cache holds ~200 MB of binaries (Go's build cache for them: ~3 GB in ~/.cache/go-build).
# Not here: no controller-manager (no `default` ServiceAccount, no token/namespace/garbage collectors: a deleted
#        namespace stays Terminating, ownerReferences are not cascaded), no scheduler, no kubelet (no pod runs).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MOD=$REPO/build/kube
LAB=${KUBE_LAB:-/tmp/evalrun-kube}
CACHE=${KUBE_LAB_CACHE:-/var/cache/evalrun-kube}
PORT=${KUBE_PORT:-6443}
ETCD_PORT=${KUBE_ETCD_PORT:-2379}
PIDS=$LAB/pids   # our own pid files
LOGS=$LAB/log
PKI=$LAB/pki
SERVICE_CIDR=10.0.0.0/24   # as envtest; the `kubernetes` Service gets 10.0.0.1 (also in the serving cert)
RECIPE=1                   # bump when the build commands below change, so caches are rebuilt
t0=$(date +%s%N)
elapsed() { local ms=$(( ($(date +%s%N) - t0) / 1000000 )); printf '%d.%02d' $((ms / 1000)) $((ms % 1000 / 10)); }
say() { echo "kube-up: $*"; }
TAG=kube-up
# shellcheck source=daemon-lib.sh
. "$REPO/scripts/daemon-lib.sh"

# port_free PORT: nothing listens on 127.0.0.1:PORT (else a health check could answer for someone else's daemon)
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
need_ports() {  # need_ports WHAT PORT...: die unless every PORT is free
  local what=$1 p; shift
  for p in "$@"; do port_free "$p" || die "127.0.0.1:$p is already in use, $what cannot start (another lab? set KUBE_PORT / KUBE_ETCD_PORT)"; done
}
etcd_ok() { curl -sf --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" | grep -q '"health":"true"'; }
api_ready() { curl -sf --max-time 2 --cacert "$PKI/ca.crt" "https://127.0.0.1:$PORT/readyz"; }

command -v go >/dev/null || die "go is not on PATH (needed to build or locate the cached binaries)"
command -v openssl >/dev/null && command -v curl >/dev/null || die "need openssl and curl"

# Serialise kube-up/down calls on this $KUBE_LAB (test sessions may run side by side).
mkdir -p "$(dirname "$LAB")"
exec 9>"${LAB%/}.lock"
flock -w 900 9 || die "timed out waiting for ${LAB%/}.lock"

# --- binaries: one cache dir per stamp; only a fresh machine (or a changed pin) builds
modver() { awk -v m="$1" '$1 == m && $2 ~ /^v[0-9]/ { print $2; exit }' "$MOD/go.mod"; }  # its require line
KV=$(modver k8s.io/kubernetes)
EV=$(modver go.etcd.io/etcd/server/v3)
[ -n "$KV" ] && [ -n "$EV" ] || die "cannot read the k8s.io/kubernetes / etcd versions from $MOD/go.mod"
want="kubernetes=$KV etcd=$EV go=$(go env GOVERSION) recipe=$RECIPE gomod=$(grep -v '^//' "$MOD/go.mod" | sha256sum | cut -c1-16) gosum=$(sha256sum <"$MOD/go.sum" | cut -c1-16)"
DIR=$CACHE/k8s-$KV-etcd-$EV-$(printf '%s' "$want" | sha256sum | cut -c1-12)
BIN=$DIR/bin
cached() { [ -f "$DIR/stamp" ] && [ "$(cat "$DIR/stamp")" = "$want" ] && [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kubectl" ] && [ -x "$BIN/etcd" ]; }

build() {
  mkdir -p "$CACHE" "$LOGS"
  exec 8>"$CACHE/.lock"   # one build per machine, whichever $KUBE_LAB asked first
  flock -w 3600 8 || die "timed out waiting for $CACHE/.lock"
  if cached; then exec 8>&-; return 0; fi
  local tmp tb minor date ld d log=$LOGS/build.log
  rm -rf "$CACHE"/.build.*   # left by an interrupted build (we hold the lock)
  tmp=$(mktemp -d "$CACHE/.build.XXXXXX")
  minor=${KV#v1.}; minor=${minor%%.*}
  date=$(cd "$MOD" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly go list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes 2>/dev/null || true)
  # what `kubectl version` and /version report (else v0.0.0-master); the tag's date stands in for the build date
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$KV -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.gitCommit=${date:+ -X $p.buildDate=$date}"
  done
  say "building kube-apiserver + kubectl $KV and etcd $EV (first time on this machine; log: $log)"
  tb=$(date +%s%N)
  (
    cd "$MOD"
    export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false ${KUBE_GOFLAGS:-}"
    nice -n 15 go build -trimpath -ldflags "$ld" -o "$tmp/bin/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
    nice -n 15 go build -trimpath -ldflags "-s -w" -o "$tmp/bin/etcd" go.etcd.io/etcd/server/v3
  ) >"$log" 2>&1 || { rm -rf "$tmp"; die "go build failed" "$log"; }
  "$tmp/bin/kube-apiserver" --version >/dev/null && "$tmp/bin/etcd" --version >/dev/null \
    && "$tmp/bin/kubectl" version --client >/dev/null \
    || { rm -rf "$tmp"; die "the built binaries do not run"; }
  echo "$want" >"$tmp/stamp"
  chmod 755 "$tmp"
  rm -rf "$DIR"
  mv "$tmp" "$DIR"
  # drop builds of other pins (~200 MB each) unless a process still runs one of their binaries
  for d in "$CACHE"/k8s-*; do
    [ "$d" = "$DIR" ] || [ ! -d "$d" ] && continue
    readlink /proc/[0-9]*/exe 2>/dev/null | grep -q "^$d/" || rm -rf "$d"
  done
  exec 8>&-
  say "built in $(( ($(date +%s%N) - tb) / 1000000000 ))s: $(cd "$BIN" && du -sh kube-apiserver kubectl etcd | awk '{printf "%s %s  ", $2, $1}')"
}

stale_warning() {  # daemons started from an older build (the pins changed while they ran) keep running
  local n
  for n in etcd kube-apiserver; do
    alive "$n" && [ "$(readlink "/proc/$(cat "$PIDS/$n")/exe")" != "$BIN/$n" ] \
      && say "WARNING: the running $n is not the current build ($BIN); run kube-down.sh, then kube-up.sh" >&2
  done
  return 0
}
if cached && alive etcd && alive kube-apiserver && [ -s "$LAB/kubeconfig" ] && api_ready >/dev/null 2>&1; then
  stale_warning
  say "already up (https://127.0.0.1:$PORT; source $LAB/env.sh)"; exit 0
fi
cached || build
say "binaries ready at $(elapsed)s ($BIN)"
mkdir -p "$PIDS" "$LOGS"

# --- PKI, made once per $KUBE_LAB and reused (so kubeconfigs and tokens stay valid across restarts):
# CA, serving cert for 127.0.0.1/localhost/kubernetes.default.svc, service-account signing key, admin token.
if ! { [ -s "$PKI/ca.crt" ] && [ -s "$PKI/apiserver.crt" ] && [ -s "$PKI/sa.key" ] && [ -s "$PKI/tokens.csv" ]; }; then
  rm -rf "$PKI"; mkdir -p -m 700 "$PKI"
  (
    cd "$PKI"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
      -keyout ca.key -out ca.crt -subj "/CN=evalrun-kube-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver"
    printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
      "extendedKeyUsage=serverAuth" \
      "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" >apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile apiserver.ext -out apiserver.crt
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key
    openssl pkey -in sa.key -pubout -out sa.pub
    openssl rand -hex 32 >admin.token
    # token,user,uid,"groups": the admin is in system:masters (all verbs on everything, RBAC or not)
    echo "$(cat admin.token),evalrun-admin,evalrun-admin,\"system:masters\"" >tokens.csv
    rm -f apiserver.csr apiserver.ext ca.srl
    chmod 600 ./*.key admin.token tokens.csv
  ) >"$LOGS/pki.log" 2>&1 || die "making the PKI failed" "$LOGS/pki.log"
fi

# --- kubeconfig (admin via the static token) and env.sh; rewritten every time (the port may have changed)
cat >"$LAB/kubeconfig.new" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: evalrun-kube
  cluster:
    server: https://127.0.0.1:$PORT
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: evalrun-admin
  user:
    token: $(cat "$PKI/admin.token")
contexts:
- name: evalrun-kube
  context: {cluster: evalrun-kube, user: evalrun-admin, namespace: default}
current-context: evalrun-kube
EOF
chmod 600 "$LAB/kubeconfig.new"; mv "$LAB/kubeconfig.new" "$LAB/kubeconfig"
cat >"$LAB/env.sh" <<EOF
export KUBE_LAB=$LAB
export KUBECONFIG=$LAB/kubeconfig
case ":\$PATH:" in *":$BIN:"*) ;; *) export PATH=$BIN:\$PATH ;; esac
EOF

# --- etcd: loopback only, scratch data dir; no fsync (test data, much faster on this disk)
if ! alive etcd; then
  need_ports etcd "$ETCD_PORT" "$((ETCD_PORT + 1))"
  start etcd "$BIN/etcd" --name=evalrun --data-dir="$LAB/etcd" \
    --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls="http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-advertise-peer-urls="http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster="evalrun=http://127.0.0.1:$((ETCD_PORT + 1))" \
    --unsafe-no-fsync=true --log-level=warn
  poll 60 etcd etcd_ok || die "etcd did not become healthy within 60 s (port $ETCD_PORT taken?)" "$LOGS/etcd.log"
  say "etcd up at $(elapsed)s (127.0.0.1:$ETCD_PORT)"
fi

# --- kube-apiserver (flags after controller-runtime's envtest, plus TLS from our CA, tokens and RBAC).
# --endpoint-reconciler-type=none: the server refuses a loopback --advertise-address for the `kubernetes` Service's
# endpoints ("may not be in the loopback range"); nothing here routes to that Service anyway (no pods run).
# --disable-admission-plugins=ServiceAccount (as envtest): no controller-manager creates `default` ServiceAccounts.
if ! alive kube-apiserver; then
  need_ports kube-apiserver "$PORT"
  start kube-apiserver "$BIN/kube-apiserver" \
    --advertise-address=127.0.0.1 --bind-address=127.0.0.1 --secure-port="$PORT" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --cert-dir="$PKI" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" --token-auth-file="$PKI/tokens.csv" \
    --authorization-mode=RBAC \
    --service-account-issuer="https://127.0.0.1:$PORT" \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" --allow-privileged=true \
    --disable-admission-plugins=ServiceAccount --endpoint-reconciler-type=none
fi
if ! poll 120 kube-apiserver api_ready; then
  alive kube-apiserver || die "kube-apiserver exited" "$LOGS/kube-apiserver.log"
  die "kube-apiserver not ready within 120 s on 127.0.0.1:$PORT: $(curl -s --max-time 2 --cacert "$PKI/ca.crt" \
    "https://127.0.0.1:$PORT/readyz?verbose" | grep -v ' ok$' | head -5)" "$LOGS/kube-apiserver.log"
fi
say "kube-apiserver ready at $(elapsed)s (https://127.0.0.1:$PORT)"
"$BIN/kubectl" --kubeconfig "$LAB/kubeconfig" get --raw /version >/dev/null || die "kubectl cannot reach the API server"
stale_warning
say "up in $(elapsed)s (KUBECONFIG=$LAB/kubeconfig; source $LAB/env.sh)"
