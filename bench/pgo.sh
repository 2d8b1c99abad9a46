#!/usr/bin/env bash
# bench/pgo.sh: refreshes cmd/scafo-edge/default.pgo, the CPU profile Go's
# profile-guided optimisation builds the edge with (go build picks up a
# default.pgo in the main package's directory by itself).
#
# The profile is scafo-edge's own, under the loads the table measures:
# bench/run.sh --profile takes one CPU profile per cell through the edge's
# admin listener (/debug/pprof/profile), and go tool pprof -proto merges them
# into one. See bench/README.md, "Profile-guided optimisation", for when to
# refresh it and how to check that it still helps.
set -euo pipefail

usage() {
	cat <<'EOF2'
Usage: bench/pgo.sh [flags] [-- run.sh flags]

  --cells LIST     the loads profiled (default http-1k,https-1k,h2-1k)
  --duration D     CPU profile per cell, whole seconds (default 30s)
  --out FILE       where the merged profile goes
                   (default cmd/scafo-edge/default.pgo)
  --keep DIR       keep the per-cell profiles and summaries in DIR
  -h, --help       this text

Flags after -- go to bench/run.sh (e.g. --edge-rev REV, --port-base N).
EOF2
}

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CELLS=http-1k,https-1k,h2-1k
DURATION=30s
OUT=$REPO/cmd/scafo-edge/default.pgo
KEEP=
PASS=()
while (($#)); do
	case $1 in
	--cells) CELLS=$2; shift ;;
	--duration) DURATION=$2; shift ;;
	--out) OUT=$2; shift ;;
	--keep) KEEP=$2; shift ;;
	-h | --help) usage; exit 0 ;;
	--) shift; PASS=("$@"); break ;;
	*) echo "pgo.sh: unknown flag $1" >&2; usage >&2; exit 2 ;;
	esac
	shift
done

DIR=${KEEP:-$(mktemp -d "${TMPDIR:-/tmp}/scafo-pgo.XXXXXX")}
[[ -n $KEEP ]] || trap 'rm -rf "$DIR"' EXIT
mkdir -p "$DIR"

"$REPO/bench/run.sh" --profile "$DIR" --cells "$CELLS" --duration "$DURATION" "${PASS[@]}" >"$DIR/summary.md"

profiles=()
IFS=, read -r -a cells <<<"$CELLS"
for c in "${cells[@]}"; do
	[[ -s $DIR/$c/cpu.pprof ]] || { echo "pgo.sh: no CPU profile for $c in $DIR" >&2; exit 1; }
	profiles+=("$DIR/$c/cpu.pprof")
done
# Beside, then renamed: an interrupted merge leaves the old profile in place.
go tool pprof -proto "${profiles[@]}" >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "pgo.sh: wrote $OUT ($(wc -c <"$OUT") bytes) from the $CELLS loads, ${DURATION} each:" >&2
grep -E '^## |µs/request' "$DIR/summary.md" >&2
