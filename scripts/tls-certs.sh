#!/usr/bin/env bash
# Makes what the chart's TLS scrape needs (docs/install.md, "TLS end to end"): a private CA, a
# serving certificate for the agents, the agents' web config, and the two Secrets the documented
# values name:
#
#   fabricscope-web  web.yml, tls.crt, tls.key  (web.existingSecret: the agent serves HTTPS)
#   fabricscope-ca   ca.crt                     (serviceMonitor.tlsConfig.ca: Prometheus verifies)
#
# The agents listen on their nodes' addresses (host network), and Prometheus scrapes each node's
# IP. The certificate names the agents by one DNS name (--server-name, default "fabricscope";
# Prometheus checks it through the ServiceMonitor's tlsConfig.serverName, so a node added later
# needs no new certificate) and also carries every node IP given (--ip, --from-nodes), for
# clients that check the address they dialled (curl https://<node IP>:10118/metrics).
#
# The CA's key stays in DIR, never in the cluster. Run again with the same DIR to renew the
# serving certificate or add nodes: the CA is kept, so Prometheus's trust does not change.
#
#   scripts/tls-certs.sh -n fabricscope --from-nodes nvidia.com/gpu.present=true --apply ./pki
#
# Needs openssl; kubectl only for --apply and --from-nodes.
set -euo pipefail

usage() {
  cat >&2 <<'EOF'
usage: scripts/tls-certs.sh [options] DIR
  -n, --namespace NS        the release's namespace (default fabricscope)
  --secret-prefix NAME      Secrets NAME-web and NAME-ca (default fabricscope)
  --server-name NAME        the DNS name in the certificate that Prometheus checks
                            (serviceMonitor.tlsConfig.serverName; default fabricscope)
  --ip ADDR                 a node address to add to the certificate (repeatable)
  --from-nodes SELECTOR     add the InternalIP of every node matching the label selector
  --days N                  the serving certificate's lifetime (default 365)
  --extra-web-config FILE   lines appended to web.yml (e.g. basic_auth_users)
  --apply                   kubectl apply the Secrets (else they are written to
                            DIR/secrets.yaml only)
EOF
  exit 2
}

namespace=fabricscope
prefix=fabricscope
server_name=fabricscope
days=365
apply=0
extra=""
selector=""
ips=()
dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    -n | --namespace) namespace=${2:?}; shift 2 ;;
    --secret-prefix) prefix=${2:?}; shift 2 ;;
    --server-name) server_name=${2:?}; shift 2 ;;
    --ip) ips+=("${2:?}"); shift 2 ;;
    --from-nodes) selector=${2:?}; shift 2 ;;
    --days) days=${2:?}; shift 2 ;;
    --extra-web-config) extra=${2:?}; shift 2 ;;
    --apply) apply=1; shift ;;
    -h | --help) usage ;;
    -*) echo "tls-certs.sh: unknown option $1" >&2; usage ;;
    *) [ -z "$dir" ] || usage; dir=$1; shift ;;
  esac
done
[ -n "$dir" ] || usage
case "$days" in '' | *[!0-9]*) echo "tls-certs.sh: --days must be a whole number of days" >&2; exit 2 ;; esac
if [ -n "$extra" ] && [ ! -f "$extra" ]; then
  echo "tls-certs.sh: --extra-web-config: no such file: $extra" >&2
  exit 2
fi

if [ -n "$selector" ]; then
  while IFS= read -r ip; do
    [ -n "$ip" ] && ips+=("$ip")
  done < <(kubectl get nodes -l "$selector" \
    -o jsonpath='{range .items[*]}{range .status.addresses[?(@.type=="InternalIP")]}{.address}{"\n"}{end}{end}')
fi

umask 077
mkdir -p "$dir"
cd "$dir"

if [ ! -f ca.crt ] || [ ! -f ca.key ]; then
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key 2>/dev/null
  openssl req -x509 -new -key ca.key -sha256 -days 3650 -subj "/CN=fabricscope scrape CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" -out ca.crt
  echo "tls-certs.sh: new CA in $PWD/ca.crt (its key ca.key stays here)" >&2
fi

san="DNS:${server_name},DNS:${server_name}.${namespace}.svc"
for ip in "${ips[@]+"${ips[@]}"}"; do
  case "$ip" in
    *[!0-9a-fA-F.:]* | '') echo "tls-certs.sh: not an IP address: $ip" >&2; exit 2 ;;
  esac
  san="${san},IP:${ip}"
done

openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out tls.key 2>/dev/null
openssl req -new -key tls.key -subj "/CN=${server_name}" -out tls.csr
printf '%s\n' "basicConstraints=critical,CA:FALSE" \
  "keyUsage=critical,digitalSignature" \
  "extendedKeyUsage=serverAuth" \
  "subjectAltName=${san}" > tls.ext
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -set_serial "0x$(openssl rand -hex 16)" \
  -days "$days" -sha256 -extfile tls.ext -out tls.crt 2>/dev/null
rm -f tls.csr tls.ext
openssl verify -CAfile ca.crt tls.crt >/dev/null

# relative paths name the other keys of the same Secret (mounted side by side)
printf 'tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n' > web.yml
if [ -n "$extra" ]; then
  cat -- "$extra" >> web.yml
fi

# the Secrets as `kubectl create secret generic --from-file` writes them, without a cluster
secret() { # NAME FILE...
  printf 'apiVersion: v1\nkind: Secret\ntype: Opaque\nmetadata:\n  name: %s\n  namespace: %s\n' \
    "$1" "$namespace"
  printf 'data:\n'
  shift
  for f in "$@"; do
    printf '  %s: %s\n' "$f" "$(base64 -w0 < "$f")"
  done
}
{
  secret "${prefix}-web" web.yml tls.crt tls.key
  echo "---"
  secret "${prefix}-ca" ca.crt
} > secrets.yaml

if [ "$apply" = 1 ]; then
  kubectl apply -f secrets.yaml
fi

cat <<EOF
certificate for ${san} in $PWD/tls.crt (valid ${days} days)
Secrets ${prefix}-web and ${prefix}-ca in namespace ${namespace}: $PWD/secrets.yaml$([ "$apply" = 1 ] && echo " (applied)")
helm values:
  --set web.existingSecret=${prefix}-web --set web.tls=true
  --set serviceMonitor.tlsConfig.ca.secret.name=${prefix}-ca
  --set serviceMonitor.tlsConfig.ca.secret.key=ca.crt
  --set serviceMonitor.tlsConfig.serverName=${server_name}
EOF
