#!/bin/sh
# Syncs per claim of one row, measured: runs claim_peers for that row alone under strace (every
# thread: -f), then counts the fsync/fdatasync calls inside each measured window (the binary calls
# getppid right before and right after each window; nothing else in it does) and divides by the
# claims the run reports for that window. The pre-fill's syncs fall outside every window.
#   sh count_syncs.sh "rocksdb txn" [claim_peers flags...]
# The environment of the README's command (ROCKSDB_LIB_DIR, ROCKSDB_INCLUDE_DIR) must be set.
set -eu
row=$1
shift
out=${TMPDIR:-/tmp}/claim_peers-strace-$$
cargo build --release --quiet
bin=${CARGO_TARGET_DIR:-target}/release/claim_peers
strace -f --seccomp-bpf -C -e trace=fsync,fdatasync,sync_file_range,getppid -o "$out.trace" \
    "$bin" --only "$row" --records 100000 --secs 2 --settle 1 "$@" >"$out.log"
echo "whole run (pre-fill included), strace -f -c:"
sed -n '/% time/,$p' "$out.trace"
grep '^window' "$out.log" | sed 's/.*callers=\([0-9]*\).*: \([0-9]*\) claims.*/\1 \2/' >"$out.claims"
awk '
    / getppid\(/ { if (inside) { print n_fsync, n_fdatasync, n_range; inside = 0 } else { inside = 1; n_fsync = n_fdatasync = n_range = 0 }; next }
    /resumed>/ { next }
    inside && / fsync\(/ { n_fsync++ }
    inside && / fdatasync\(/ { n_fdatasync++ }
    inside && / sync_file_range\(/ { n_range++ }
' "$out.trace" >"$out.windows"
echo
echo "measured windows ($row):"
echo "| callers | claims | fsync | fdatasync | sync_file_range | (fsync+fdatasync)/claim |"
echo "|---:|---:|---:|---:|---:|---:|"
paste -d' ' "$out.claims" "$out.windows" | awk '{ printf "| %s | %s | %s | %s | %s | %.3f |\n", $1, $2, $3, $4, $5, ($3 + $4) / $2 }'
rm -f "$out.trace" "$out.log" "$out.claims" "$out.windows"
