#!/bin/bash
# harbor_handcheck.sh BASE TASK_DIR...: verifies Harbor task dirs by hand, without the image builder.
#
# BASE is a Debian root filesystem holding the shipped tasks' shared packages, built once and reused:
#   mmdebstrap --variant=minbase --include="$(harbor_handcheck.sh --packages)" bookworm BASE
# (the script builds it when BASE does not exist). For each task it
#   1. plays the rest of environment/Dockerfile over BASE in an overlay (the FROM line and the shared
#      apt-get line are what BASE already is; WORKDIR, ENV, COPY of the context and RUN follow, RUN
#      in bubblewrap over the merged tree, without network);
#   2. runs three episodes, each in a fresh overlay over that image: solution/solve.sh then the
#      verifier (must write 1), the verifier alone (the no-op: must write 0), and everything in the
#      work dir deleted then the verifier (must write 0);
#   3. prints one line: the task, the image step's seconds, the three rewards, the seconds per episode.
# The verifier runs as the harness would: /tests read-only, a fresh /logs/verifier, cwd the workdir.
# Exit 1 when any task's oracle is not 1 or its no-op or deletion is not 0. Needs root (or a user
# namespace with mounts), overlayfs, bwrap and mmdebstrap. The supported Dockerfile subset is the one
# the shipped tasks use (one instruction per line, or continued with a trailing backslash).
set -uo pipefail

SHARED_RUN='RUN apt-get update && apt-get install -y --no-install-recommends gawk gcc git jq libc6-dev make procps python3 sqlite3 && rm -rf /var/lib/apt/lists/*'
PACKAGES=$(sed -e 's/.*--no-install-recommends //' -e 's/ &&.*//' -e 's/ /,/g' <<<"$SHARED_RUN")

elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

if [ "${1:-}" = "--packages" ]; then echo "$PACKAGES"; exit 0; fi
if [ $# -lt 2 ]; then echo "usage: $0 BASE TASK_DIR... | $0 --packages" >&2; exit 2; fi
BASE=$1; shift

if [ ! -x "$BASE/usr/bin/python3" ]; then
    t0=$(date +%s.%N)
    mmdebstrap --quiet --variant=minbase --include="$PACKAGES" bookworm "$BASE" || { echo "mmdebstrap failed" >&2; exit 2; }
    echo "base built in $(elapsed "$t0") s: $BASE"
fi

# In a private mount namespace: the overlays vanish with it.
if [ -z "${HANDCHECK_NS:-}" ]; then
    HANDCHECK_NS=1 exec unshare --mount --propagation private "$0" "$BASE" "$@"
fi

sandbox() {  # sandbox ROOT CWD [bwrap options...] -- CMD...: CMD in bwrap over ROOT, no network
    local root=$1 cwd=$2; shift 2
    bwrap --bind "$root" / --proc /proc --dev /dev --unshare-all --die-with-parent --chdir "$cwd" \
        --setenv PATH /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --setenv HOME /root "$@"
}

overlay() {  # overlay LOWER UPPER_PARENT: mounts UPPER_PARENT/merged over LOWER (':'-separated)
    mkdir -p "$2/upper" "$2/work" "$2/merged"
    mount -t overlay overlay -o "lowerdir=$1,upperdir=$2/upper,workdir=$2/work" "$2/merged"
}

build_image() {  # build_image TASK_DIR LAYER: plays the Dockerfile after the shared prefix into LAYER
    local task=$1 layer=$2 ctx=$1/environment wd=/ line n=0 src dst
    overlay "$BASE" "$layer" || return 1
    while IFS= read -r line; do
        n=$((n + 1))
        case "$line" in
        "" | "#"*) ;;
        "FROM debian:bookworm-slim") ;;
        "$SHARED_RUN") ;;
        WORKDIR\ *) wd=${line#WORKDIR }; mkdir -p "$layer/merged$wd" ;;
        ENV\ *) ;;
        COPY\ *)
            read -r -a args <<<"${line#COPY }"
            dst=${args[-1]}
            for src in "${args[@]:0:${#args[@]}-1}"; do
                if [ -d "$ctx/$src" ]; then mkdir -p "$layer/merged$dst" && cp -a "$ctx/$src/." "$layer/merged$dst"
                elif [[ $dst == */ ]]; then mkdir -p "$layer/merged$dst" && cp -a "$ctx/$src" "$layer/merged$dst"
                else mkdir -p "$(dirname "$layer/merged$dst")" && cp -a "$ctx/$src" "$layer/merged$dst"; fi || return 1
            done ;;
        RUN\ *) sandbox "$layer/merged" "$wd" -- /bin/sh -c "${line#RUN }" || { echo "line $n failed: $line" >&2; return 1; } ;;
        *) echo "$task: Dockerfile line $n is outside the hand check's subset: $line" >&2; return 1 ;;
        esac
    done < <(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$ctx/Dockerfile")
    echo "$wd" > "$layer/workdir"
    umount "$layer/merged"
}

episode() {  # episode TASK_DIR LAYER DIR COMMAND: runs COMMAND (or nothing) then the verifier; prints the reward
    local task=$1 layer=$2 ep=$3 cmd=$4 wd
    wd=$(cat "$layer/workdir")
    overlay "$layer/upper:$BASE" "$ep" || return 1
    if [ -n "$cmd" ]; then
        sandbox "$ep/merged" "$wd" --ro-bind "$task/solution" /solution -- /bin/bash -c "$cmd" > "$ep/agent.log" 2>&1
    fi
    mkdir -p "$ep/logs" "$ep/merged/tests" "$ep/merged/logs/verifier"
    sandbox "$ep/merged" "$wd" --ro-bind "$task/tests" /tests --bind "$ep/logs" /logs/verifier \
        -- timeout 120 /bin/bash /tests/test.sh > "$ep/verifier.log" 2>&1
    umount "$ep/merged"
    cat "$ep/logs/reward.txt" 2>/dev/null || echo "none"
}


scratch=$(mktemp -d /tmp/harbor_handcheck.XXXXXX)
status=0
printf '%-24s %7s %6s %6s %6s  %s\n' task image_s oracle noop delete "episode seconds (oracle, noop, delete)"
for task in "$@"; do
    task=$(realpath "$task") name=$(basename "$task") w=$scratch/$(basename "$task")
    t0=$(date +%s.%N)
    if ! build_image "$task" "$w/image" 2> "$w.build.log"; then
        echo "$name: image failed ($(tail -n 3 "$w.build.log" | tr '\n' ' '))"; status=1; continue
    fi
    img_s=$(elapsed "$t0")
    t0=$(date +%s.%N); oracle=$(episode "$task" "$w/image" "$w/oracle" "bash /solution/solve.sh"); s1=$(elapsed "$t0")
    t0=$(date +%s.%N); noop=$(episode "$task" "$w/image" "$w/noop" ""); s2=$(elapsed "$t0")
    t0=$(date +%s.%N); del=$(episode "$task" "$w/image" "$w/delete" "find . -mindepth 1 -delete"); s3=$(elapsed "$t0")
    printf '%-24s %7s %6s %6s %6s  %s %s %s\n' "$name" "$img_s" "$oracle" "$noop" "$del" "$s1" "$s2" "$s3"
    [ "$oracle" = 1 ] && [ "$noop" = 0 ] && [ "$del" = 0 ] || status=1
done
echo "logs: $scratch"
exit $status
