#!/bin/sh
# Restores a first member from a snapshot with its revision raised above every revision the old
# cluster served (docs/day2.md, "Revisions after a restore"). The user data writes it and runs
#
#   restore-bump.sh BUMP SNAPSHOT_FILE INSTALL_DIR etcdadm init ... --snapshot SNAPSHOT_FILE
#
# With an etcdutl that has `snapshot restore --bump-revision` (etcd 3.5.10 and later, 3.6) on
# the PATH or in INSTALL_DIR, the snapshot is restored into a scratch directory with the
# revision raised by BUMP and every older revision marked compacted, and its database replaces
# SNAPSHOT_FILE; etcdadm then restores that (`--skip-hash-check`: a database copied out of a
# data directory carries no snapshot hash). Without one, etcdadm restores the snapshot as it is
# and the revision stays where it was: the EtcdadmCluster controller sees it and says so.
set -eu

bump=$1
snapshot=$2
install_dir=$3
shift 3

say() {
  echo "etcd restore: $*"
}

tool=""
for candidate in "$(command -v etcdutl 2>/dev/null || true)" "$install_dir/etcdutl"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] \
    && "$candidate" snapshot restore --help 2>&1 | grep -q -e '--bump-revision'; then
    tool=$candidate
    break
  fi
done
if [ -z "$tool" ]; then
  say "no etcdutl with --bump-revision (etcd 3.5.10 or later): the revision is not raised"
  exec "$@"
fi

scratch="$(dirname "$snapshot")/bumped"
rm -rf "$scratch"
say "raising the revision by $bump with $tool"
"$tool" snapshot restore "$snapshot" --data-dir "$scratch" --bump-revision "$bump" --mark-compacted
mv "$scratch/member/snap/db" "$snapshot"
rm -rf "$scratch"
exec "$@" --skip-hash-check
