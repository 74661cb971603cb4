#!/bin/sh
# Joins this machine's etcd member as the learner the EtcdadmCluster controller pre-adds
# (docs/day2.md, "Learner joins"). The user data writes it and calls it around `etcdadm join`:
#
#   learner-join.sh wait-listed SECONDS JOIN_URL
#     Waits until JOIN_URL lists the peer URL of one of this machine's addresses, the one the
#     controller registered (the Machine's reported address, which need not be the default
#     route's), and writes that address to /run/cluster-api/etcd-member-address for
#     `etcdadm join --bind-address`. Run before `etcdadm join`, which adds a voting member itself
#     when it does not find one.
#   learner-join.sh wait-healthy SECONDS JOIN_URL [ETCDADM_JOIN_FLAGS...]
#     Re-runs `etcdadm join phase health` until it passes. Run when `etcdadm join` failed: its
#     health read fails while the member is a learner not yet promoted.
#
# Printed lines land in the cloud-init output log; failures exit 1 naming what is missing.
set -eu

pki=/etc/etcd/pki

say() {
  echo "etcd learner join: $*"
}

fail() {
  say "$*" >&2
  exit 1
}

# Where wait-listed leaves the address the learner list names.
member_address_file=/run/cluster-api/etcd-member-address

# This machine's global IPv4 addresses, one a line.
machine_addresses() {
  ip -4 -o addr show scope global | awk '{ split($4, cidr, "/"); print cidr[1] }'
}

# A client certificate for one day, signed by the CA the user data wrote, in $tmp (private,
# removed on exit): the member list is served only to clients the CA vouches for.
mint_client_certificate() {
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/CN=etcdadm-learner-join" -keyout "$tmp/client.key" -out "$tmp/client.csr" \
    2>"$tmp/openssl.log" &&
    printf 'extendedKeyUsage = clientAuth\n' >"$tmp/client.ext" &&
    serial=$(openssl rand -hex 16) &&
    openssl x509 -req -in "$tmp/client.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
      -set_serial "0x$serial" -days 1 -extfile "$tmp/client.ext" -out "$tmp/client.crt" \
      2>>"$tmp/openssl.log"
}

member_list() {
  curl --silent --show-error --fail --max-time 5 --cacert "$pki/ca.crt" \
    --cert "$tmp/client.crt" --key "$tmp/client.key" \
    -X POST --data '{}' "$1/v3/cluster/member/list" 2>&1
}

wait_listed() {
  [ $# -eq 2 ] || fail "usage: wait-listed SECONDS JOIN_URL"
  seconds=$1
  url=$2
  addresses=$(machine_addresses) || addresses=""
  [ -n "$addresses" ] || fail "this machine has no global IPv4 address: etcdadm builds IPv4 URLs only"
  tmp=$(mktemp -d) || fail "cannot create a temporary directory"
  trap 'rm -rf "$tmp"' EXIT
  mint_client_certificate ||
    fail "cannot mint a client certificate from $pki/ca.crt and $pki/ca.key: $(cat "$tmp/openssl.log")"
  deadline=$(($(date +%s) + seconds))
  peers=$(for address in $addresses; do printf 'https://%s:2380 ' "$address"; done)
  say "waiting up to $seconds s for $url to list one of $peers(this machine's addresses), the member the EtcdadmCluster controller adds as a learner"
  while :; do
    if answer=$(member_list "$url"); then
      for address in $addresses; do
        case $answer in
        *"\"https://$address:2380\""*)
          echo "$address" >"$member_address_file" ||
            fail "cannot write $member_address_file"
          say "$url lists https://$address:2380: etcd binds to $address"
          return 0
          ;;
        esac
      done
      last="the member list has none of them"
    else
      last=$answer
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      fail "gave up after $seconds s: $url never listed any of $peers($last). The EtcdadmCluster controller adds https://<Machine address>:2380 once the Machine reports an address: if the Machine reports an address this machine does not hold, they disagree. etcdadm join is not run: it would add a voting member."
    fi
    # Asked twice a second: the join starts as soon as the learner is listed, and one member
    # list is little for etcd. A sleep that takes whole seconds only waits one.
    sleep 0.5 2>/dev/null || sleep 1
  done
}

wait_healthy() {
  [ $# -ge 2 ] || fail "usage: wait-healthy SECONDS JOIN_URL [ETCDADM_JOIN_FLAGS...]"
  seconds=$1
  url=$2
  shift 2
  systemctl is-active --quiet etcd ||
    fail "etcdadm join failed before etcd ran (see its errors above); not waiting for a promotion"
  deadline=$(($(date +%s) + seconds))
  say "etcd runs as a learner: re-running etcdadm's health phase for up to $seconds s, until the EtcdadmCluster controller has promoted it"
  until etcdadm join phase health "$url" "$@"; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      systemctl is-active --quiet etcd ||
        fail "etcd stopped while waiting for its promotion (a removed member stops): see the EtcdadmCluster's status"
      fail "etcd still fails its health check after $seconds s: the learner may not have caught up, or was not promoted; see the EtcdadmCluster's status"
    fi
    sleep 1
  done
  say "etcd is healthy: the member was promoted"
}

command=${1:-}
[ $# -gt 0 ] && shift
case $command in
wait-listed) wait_listed "$@" ;;
wait-healthy) wait_healthy "$@" ;;
*) fail "usage: $0 wait-listed SECONDS JOIN_URL | wait-healthy SECONDS JOIN_URL [ETCDADM_JOIN_FLAGS...]" ;;
esac
