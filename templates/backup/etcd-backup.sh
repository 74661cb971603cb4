#!/bin/sh
# etcd-backup: run on every etcd member by etcd-backup.timer. Only the member that is the raft
# leader at that moment acts: it saves a snapshot through its own client endpoint, verifies it,
# stores it in a local directory or uploads it to an S3-compatible bucket, and prunes the oldest
# snapshots beyond the retention count. Followers exit 0 without doing anything, so exactly one
# snapshot is taken per tick for the whole cluster.
#
# Usage: etcd-backup.sh [ENV_FILE]   (default /etc/etcd-backup/backup.env)
#
# The env file is sourced; every setting is optional except ETCD_BACKUP_DESTINATION:
#   ETCD_BACKUP_DESTINATION      /some/dir, or s3://bucket/prefix
#   ETCD_BACKUP_RETENTION        snapshots to keep at the destination (default 24; 0 keeps all)
#   ETCD_BACKUP_ENDPOINT         this member's client URL (default https://127.0.0.1:2379)
#   ETCD_BACKUP_CACERT/_CERT/_KEY  client TLS files (default: etcdadm's etcdctl client certificate)
#   ETCD_BACKUP_ETCDCTL          etcdctl binary (default: PATH, then /opt/bin, /usr/local/bin)
#   ETCD_BACKUP_ETCDUTL          etcdutl binary (default: same search; etcdctl is used without it)
#   ETCD_BACKUP_WORK_DIR         where the snapshot is written before it is stored
#                                (default /var/lib/etcd-backup)
#   ETCD_BACKUP_S3_CLIENT        aws (default) or mc, for s3:// destinations
#   ETCD_BACKUP_S3_ENDPOINT      S3-compatible endpoint URL (MinIO, Ceph...); empty: AWS S3
#   ETCD_BACKUP_CREDENTIALS_FILE sourced too if it exists (default /etc/etcd-backup/credentials.env):
#                                AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION
#
#   ETCD_BACKUP_TIMEOUT          etcdctl timeout of the snapshot save (default 10m)
#
# Written without brace-style parameter expansion, doubled dollars or doubled backslashes, which
# clusterctl's variable processing would rewrite: the copy embedded in
# templates/cluster-template-backup.yaml must stay byte-identical to this file (a test checks).
set -eu

ETCD_BACKUP_DESTINATION=""
ETCD_BACKUP_RETENTION=24
ETCD_BACKUP_ENDPOINT=https://127.0.0.1:2379
ETCD_BACKUP_CACERT=/etc/etcd/pki/ca.crt
ETCD_BACKUP_CERT=/etc/etcd/pki/etcdctl-etcd-client.crt
ETCD_BACKUP_KEY=/etc/etcd/pki/etcdctl-etcd-client.key
ETCD_BACKUP_ETCDCTL=""
ETCD_BACKUP_ETCDUTL=""
ETCD_BACKUP_WORK_DIR=/var/lib/etcd-backup
ETCD_BACKUP_S3_CLIENT=aws
ETCD_BACKUP_S3_ENDPOINT=""
ETCD_BACKUP_CREDENTIALS_FILE=/etc/etcd-backup/credentials.env
ETCD_BACKUP_TIMEOUT=10m

log() {
  echo "etcd-backup: $*"
}

fail() {
  echo "etcd-backup: error: $*" >&2
  exit 1
}

config=/etc/etcd-backup/backup.env
if [ "$#" -ge 1 ]; then
  config=$1
fi
[ -r "$config" ] || fail "cannot read $config"
# shellcheck source=/dev/null
. "$config"
if [ -r "$ETCD_BACKUP_CREDENTIALS_FILE" ]; then
  set -a
  # shellcheck source=/dev/null
  . "$ETCD_BACKUP_CREDENTIALS_FILE"
  set +a
fi

[ -n "$ETCD_BACKUP_DESTINATION" ] || fail "ETCD_BACKUP_DESTINATION is not set in $config"
case "$ETCD_BACKUP_RETENTION" in
  '' | *[!0-9]*) fail "ETCD_BACKUP_RETENTION must be a number, got '$ETCD_BACKUP_RETENTION'" ;;
esac

# find_tool NAME CONFIGURED: the configured path, else NAME on PATH or in etcdadm's install dirs.
find_tool() {
  if [ -n "$2" ]; then
    [ -x "$2" ] || fail "$1 not executable: $2"
    echo "$2"
    return 0
  fi
  if command -v "$1" >/dev/null 2>&1; then
    command -v "$1"
    return 0
  fi
  for dir in /opt/bin /usr/local/bin; do
    if [ -x "$dir/$1" ]; then
      echo "$dir/$1"
      return 0
    fi
  done
  return 1
}

etcdctl=$(find_tool etcdctl "$ETCD_BACKUP_ETCDCTL") || fail "etcdctl not found (set ETCD_BACKUP_ETCDCTL)"
etcdutl=$(find_tool etcdutl "$ETCD_BACKUP_ETCDUTL") || etcdutl=""

ETCDCTL_API=3
export ETCDCTL_API

# ctl TIMEOUT ARGS...: etcdctl against this member only.
ctl() {
  timeout=$1
  shift
  "$etcdctl" --endpoints="$ETCD_BACKUP_ENDPOINT" --cacert="$ETCD_BACKUP_CACERT" \
    --cert="$ETCD_BACKUP_CERT" --key="$ETCD_BACKUP_KEY" --command-timeout="$timeout" "$@"
}

# Leader check on this member only. The fields format prints IDs as plain decimal uint64, the
# same in etcdctl 3.4, 3.5 and 3.6, so they are compared as strings (no arithmetic overflow).
status=$(ctl 30s endpoint status --write-out=fields) || fail "endpoint status of $ETCD_BACKUP_ENDPOINT failed"
member_id=$(printf '%s\n' "$status" | sed -n 's/^"MemberID" : \([0-9][0-9]*\)$/\1/p' | head -n 1)
leader_id=$(printf '%s\n' "$status" | sed -n 's/^"Leader" : \([0-9][0-9]*\)$/\1/p' | head -n 1)
[ -n "$member_id" ] || fail "no MemberID in the status of $ETCD_BACKUP_ENDPOINT"
if [ "$leader_id" != "$member_id" ]; then
  log "member $member_id is not the leader (leader: $leader_id); nothing to do"
  exit 0
fi

stamp=$(date -u +%Y%m%dT%H%M%S.%NZ)
case "$stamp" in
  *N*) stamp=$(date -u +%Y%m%dT%H%M%SZ) ;;
esac
name="etcd-snapshot-$stamp-$member_id.db"

mkdir -p "$ETCD_BACKUP_WORK_DIR"
work=$(mktemp -d "$ETCD_BACKUP_WORK_DIR/run.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 1' INT TERM
snapshot="$work/$name"

log "member $member_id is the leader; saving $name"
ctl "$ETCD_BACKUP_TIMEOUT" snapshot save "$snapshot" >"$work/save.log" 2>&1 || {
  cat "$work/save.log" >&2
  fail "snapshot save failed"
}

# Verify before storing: a snapshot that does not read back is never kept.
if [ -n "$etcdutl" ]; then
  verify=$("$etcdutl" snapshot status "$snapshot" --write-out=json 2>&1) || fail "snapshot status: $verify"
else
  verify=$("$etcdctl" snapshot status "$snapshot" --write-out=json 2>&1) || fail "snapshot status: $verify"
fi
case "$verify" in
  *'"totalKey"'*) log "verified: $verify" ;;
  *) fail "unexpected snapshot status output: $verify" ;;
esac

# s3 BUCKET_PATH ARGS...: run the configured S3 client; with mc, s3://bucket/prefix is addressed
# through an alias built from the endpoint and the AWS_* credentials.
s3() {
  op=$1
  shift
  case "$ETCD_BACKUP_S3_CLIENT" in
    aws)
      if [ -n "$ETCD_BACKUP_S3_ENDPOINT" ]; then
        aws --endpoint-url "$ETCD_BACKUP_S3_ENDPOINT" s3 "$op" "$@"
      else
        aws s3 "$op" "$@"
      fi
      ;;
    mc)
      mc "$op" "$@"
      ;;
    *) fail "ETCD_BACKUP_S3_CLIENT must be aws or mc, got '$ETCD_BACKUP_S3_CLIENT'" ;;
  esac
}

# prune_list: reads snapshot names, one per line, and prints those beyond the retention count,
# newest kept (names sort by time). Files that are not our snapshots are never touched.
prune_list() {
  if [ "$ETCD_BACKUP_RETENTION" -eq 0 ]; then
    cat >/dev/null
    return 0
  fi
  grep '^etcd-snapshot-.*[.]db$' | sort -r | tail -n +"$((ETCD_BACKUP_RETENTION + 1))"
}

case "$ETCD_BACKUP_DESTINATION" in
  s3://*)
    target=$(printf '%s' "$ETCD_BACKUP_DESTINATION" | sed 's,/*$,,')
    if [ "$ETCD_BACKUP_S3_CLIENT" = mc ]; then
      [ -n "$ETCD_BACKUP_S3_ENDPOINT" ] || fail "ETCD_BACKUP_S3_ENDPOINT is required with mc"
      scheme=$(printf '%s' "$ETCD_BACKUP_S3_ENDPOINT" | sed 's,://.*,,')
      host=$(printf '%s' "$ETCD_BACKUP_S3_ENDPOINT" | sed 's,^[a-z]*://,,')
      key_id=$(printenv AWS_ACCESS_KEY_ID || true)
      secret=$(printenv AWS_SECRET_ACCESS_KEY || true)
      if [ -z "$key_id" ] || [ -z "$secret" ]; then
        fail "mc needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (credentials file)"
      fi
      MC_HOST_etcdbackup="$scheme://$key_id:$secret@$host"
      export MC_HOST_etcdbackup
      target=$(printf '%s' "$target" | sed 's,^s3://,etcdbackup/,')
    fi
    s3 cp "$snapshot" "$target/$name" || fail "upload to $target/$name failed"
    log "uploaded $target/$name"
    for old in $(s3 ls "$target/" | awk '{print $NF}' | prune_list); do
      s3 rm "$target/$old" || fail "could not delete $target/$old"
      log "pruned $target/$old"
    done
    ;;
  *)
    dest=$ETCD_BACKUP_DESTINATION
    mkdir -p "$dest"
    # Copy under a name the pruning ignores, then rename: a reader never sees half a snapshot.
    cp "$snapshot" "$dest/.$name.partial"
    mv "$dest/.$name.partial" "$dest/$name"
    log "stored $dest/$name"
    for old in $(for f in "$dest"/etcd-snapshot-*.db; do [ -e "$f" ] && basename "$f"; done | prune_list); do
      rm -f "$dest/$old"
      log "pruned $dest/$old"
    done
    ;;
esac
