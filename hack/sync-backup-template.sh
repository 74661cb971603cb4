#!/usr/bin/env bash
# Copies templates/backup/etcd-backup.sh and etcd-backup.service into the `content: |` blocks of
# the matching files in the backup cluster template, so the template's embedded copies stay
# byte-identical to the sources (test/manifests checks they are).
# Usage: hack/sync-backup-template.sh [TEMPLATE]   (default templates/cluster-template-backup.yaml)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
template="${1:-$root/templates/cluster-template-backup.yaml}"

# embed PATH_ON_MACHINE SOURCE_FILE: rewrite the block scalar of that file entry in $template.
embed() {
  local target="$1" source="$2" tmp
  tmp="$(mktemp)"
  awk -v target="$target" -v source="$source" '
    function indent_of(s) { match(s, /^ */); return RLENGTH }
    function spaces(n,   s) { s = ""; while (n-- > 0) s = s " "; return s }
    state == 0 {
      trimmed = $0; sub(/^ */, "", trimmed)
      if (trimmed == "- path: " target) { item = indent_of($0); state = 1 }
      print; next
    }
    state == 1 {
      trimmed = $0; sub(/^ */, "", trimmed)
      print
      if (trimmed == "content: |") {
        pad = spaces(item + 4)
        while ((getline line < source) > 0) print (line == "" ? "" : pad line)
        close(source)
        found = 1; state = 2
      }
      next
    }
    state == 2 {
      if ($0 == "" || indent_of($0) >= item + 4) next
      state = 3
    }
    { print }
    END { if (!found) { print "no `content: |` block for " target > "/dev/stderr"; exit 1 } }
  ' "$template" > "$tmp"
  # Rewrite in place (keeps the file's mode and owner).
  cat "$tmp" > "$template"
  rm -f "$tmp"
}

embed /usr/local/sbin/etcd-backup.sh "$root/templates/backup/etcd-backup.sh"
embed /etc/systemd/system/etcd-backup.service "$root/templates/backup/etcd-backup.service"
