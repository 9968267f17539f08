#!/usr/bin/env bash
# Checks the Docker image without a Docker engine: runs the exact files the image's runtime
# stage would hold in a root file system that holds nothing else.
#
#   1. hadolint on the Dockerfile, zero findings of any level;
#   2. builds the release binary with the flags of the build stage's `swift build` line;
#   3. a debootstrap --variant=minbase root of the runtime stage's Debian suite, in which the
#      runtime stage's RUN instruction runs as written (its pinned apt-get install, its
#      useradd), cached under .build-image/ keyed by a hash of that instruction; the binary is
#      copied to the path of the runtime stage's COPY --from=build;
#   4. opqd runs in it under chroot as the Dockerfile's USER (setpriv), with exactly the
#      Dockerfile's ENV, in a network namespace of its own (as in a container: OPQD_HOST=0.0.0.0
#      reaches nothing but that namespace's loopback), /data a fresh directory bind-mounted as a
#      volume would be. It must start, pass the HEALTHCHECK command run inside the root, answer a
#      create queue / create operation / status round trip on 127.0.0.1, keep both in /data
#      across a SIGTERM and a restart, and exit 0 within 10 s of SIGTERM each time.
#
# Everything is parsed from the Dockerfile, so the check cannot drift from it. Needs root.
# Environment:
#   IMAGE_CHECK_CACHE                 where roots are cached (default .build-image)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/opt/swift/usr/bin:$PATH"
repo=$(pwd)

now() { date +%s%N; }
since() { awk -v ms=$(( ($(now) - $1) / 1000000 )) 'BEGIN { printf "%.3f", ms / 1000 }'; }
t_start=$(now)
step() { printf '\n--- image-check: %s\n' "$*"; }
fail() { echo "image-check: FAILED: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "needs root (debootstrap, chroot, mount, unshare)"
scripts/deps.sh image

# ---------------------------------------------------------------------------------------------
step "parse the Dockerfile"
eval "$(python3 - Dockerfile <<'PY'
import json, re, shlex, sys

text = open(sys.argv[1]).read()
# Join continuation lines, drop comments and the parser directive.
lines, cur = [], ""
for raw in text.splitlines():
    s = raw.strip()
    if not cur and (not s or s.startswith("#")):
        continue
    if s.startswith("#"):
        continue
    if raw.rstrip().endswith("\\"):
        cur += raw.rstrip()[:-1] + " "
        continue
    lines.append((cur + raw).strip())
    cur = ""
stages = []
for line in lines:
    word, _, rest = line.partition(" ")
    word = word.upper()
    if word == "FROM":
        parts = rest.split()
        stages.append({"image": parts[0], "name": parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else None, "ins": []})
    else:
        stages[-1]["ins"].append((word, rest.strip()))

def die(msg):
    print(f"fail {shlex.quote('Dockerfile: ' + msg)}")
    sys.exit(0)

build = next((s for s in stages if s["name"] == "build"), None)
runtime = stages[-1]
if build is None or build is runtime:
    die("expected a stage named build and a runtime stage after it")
out = {}
# The build stage's swift build command, up to the next &&.
swift = [r for w, r in build["ins"] if w == "RUN" and "swift build" in r]
if len(swift) != 1:
    die("expected one RUN with swift build in the build stage")
out["BUILD_ARGS"] = shlex.split(re.search(r"swift build[^&;]*", swift[0]).group(0))[1:]
# The runtime stage.
out["RUNTIME_IMAGE"] = runtime["image"]
m = re.fullmatch(r"debian:(\w+)(-slim)?", runtime["image"])
if not m:
    die("runtime stage is not FROM debian:<suite>[-slim]")
out["SUITE"] = m.group(1)
runs = [r for w, r in runtime["ins"] if w == "RUN"]
if not runs:
    die("runtime stage has no RUN")
out["RUNTIME_RUNS"] = runs
pkgs = []
for r in runs:
    for seg in re.split(r"&&|;|\|\|", r):
        t = shlex.split(seg)
        if "apt-get" in t and "install" in t:
            pkgs += [a for a in t[t.index("install") + 1:] if not a.startswith("-")]
if not pkgs:
    die("runtime stage installs no packages with apt-get install")
out["PACKAGES"] = pkgs
env = []
for w, r in runtime["ins"]:
    if w == "ENV":
        t = shlex.split(r)
        if t and "=" not in t[0]:
            env.append(f"{t[0]}={' '.join(t[1:])}")
        else:
            env += t
out["IMAGE_ENV"] = env
copies = [shlex.split(r) for w, r in runtime["ins"] if w == "COPY" and r.startswith("--from=build")]
if len(copies) != 1:
    die("expected one COPY --from=build in the runtime stage")
out["BINARY_DEST"] = copies[0][-1]
users = [r for w, r in runtime["ins"] if w == "USER"]
out["IMAGE_USER"] = users[-1] if users else "0"
def exec_form(word):
    vals = [r for w, r in runtime["ins"] if w == word]
    if not vals:
        return None
    v = vals[-1]
    if word == "HEALTHCHECK":
        m = re.search(r"\bCMD\s+(\[.*\])\s*$", v)
        if not m:
            die("HEALTHCHECK is not CMD [exec form]")
        v = m.group(1)
    return json.loads(v)
out["ENTRYPOINT"] = exec_form("ENTRYPOINT") or die("no exec-form ENTRYPOINT")
out["HEALTHCHECK"] = exec_form("HEALTHCHECK") or die("no HEALTHCHECK CMD")
hc = [r for w, r in runtime["ins"] if w == "HEALTHCHECK"][-1]
m = re.search(r"--timeout=(\d+)s", hc)
out["HEALTHCHECK_TIMEOUT"] = m.group(1) if m else "30"
sig = [r for w, r in runtime["ins"] if w == "STOPSIGNAL"]
out["STOPSIGNAL"] = sig[-1] if sig else "SIGTERM"
for k, v in out.items():
    if isinstance(v, list):
        print(f"{k}=({' '.join(shlex.quote(x) for x in v)})")
    else:
        print(f"{k}={shlex.quote(v)}")
PY
)"
echo "build:        swift ${BUILD_ARGS[*]}"
echo "runtime:      $RUNTIME_IMAGE (suite $SUITE)"
echo "packages:     ${PACKAGES[*]}"
echo "ENV:          ${IMAGE_ENV[*]}"
echo "USER:         $IMAGE_USER   binary at $BINARY_DEST   ENTRYPOINT ${ENTRYPOINT[*]}"
echo "HEALTHCHECK:  ${HEALTHCHECK[*]} (timeout ${HEALTHCHECK_TIMEOUT}s)   STOPSIGNAL $STOPSIGNAL"
[ "$STOPSIGNAL" = SIGTERM ] || fail "STOPSIGNAL is $STOPSIGNAL; this check stops opqd with SIGTERM"

# ---------------------------------------------------------------------------------------------
step "1. hadolint (every level, zero findings)"
t=$(now)
hadolint --failure-threshold style Dockerfile || fail "hadolint reported findings"
echo "hadolint $(hadolint --version | grep -o '[0-9.]*$'): clean ($(since "$t") s)"

# ---------------------------------------------------------------------------------------------
step "2. release binary: swift ${BUILD_ARGS[*]}"
t=$(now)
swift "${BUILD_ARGS[@]}"
bin="$(swift "${BUILD_ARGS[@]}" --show-bin-path)/opqd"
[ -x "$bin" ] || fail "no binary at $bin"
echo "built $bin ($(du -h "$bin" | cut -f1)) in $(since "$t") s"
echo "NEEDED (direct): $(readelf -d "$bin" | grep -oP 'NEEDED.*\[\K[^]]+' | tr '\n' ' ')"
echo "ldd (all, transitively):"
ldd "$bin" | sed 's/^\s*/    /'
if ldd "$bin" | grep -q 'libswift'; then fail "the binary links a shared Swift runtime library (expected --static-swift-stdlib)"; fi
t_build=$(since "$t")

# ---------------------------------------------------------------------------------------------
# The root: debootstrap, then the runtime stage's RUN instructions as written, as docker build
# runs them (/bin/sh -c, no terminal, Docker's default PATH). apt uses the same Debian sources
# as this machine (its mirror), which are those debian:*-slim ships: suite, -updates, -security.
apt_sources=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null | grep -E '^(URIs:|deb )' || true)
mirror=$(grep -v security <<<"$apt_sources" | grep -oE 'https?://[^ ]+' | head -1 || true)
mirror=${mirror:-http://deb.debian.org/debian}
security=$(grep -oE 'https?://[^ ]*security[^ ]*' <<<"$apt_sources" | head -1 || true)
security=${security:-http://deb.debian.org/debian-security}
sources="Types: deb
URIs: $mirror
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"
docker_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
cache=${IMAGE_CHECK_CACHE:-$repo/.build-image}
key=$(printf '%s\n' "v1" "$SUITE" "$sources" "${RUNTIME_RUNS[@]}" | sha256sum | cut -c1-16)
root="$cache/root-$key"

# Cleanup of everything started or mounted below, on every exit path.
pids=()
mounts=()
tmpdirs=()
cleanup() {
    local rc=$?
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
        umount "${mounts[$i]}" 2>/dev/null || umount -l "${mounts[$i]}" 2>/dev/null || true
    done
    for d in "${tmpdirs[@]}"; do rm -rf "$d"; done
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "3. runtime root: debootstrap --variant=minbase $SUITE + the runtime stage's RUN ($root)"
t=$(now)
if [ -f "$root/.image-check-complete" ]; then
    cold=warm
    echo "cached (key $key: the runtime stage's RUN and sources unchanged)"
else
    cold=cold
    mkdir -p "$cache"
    rm -rf "$cache"/tmp-root-*  # a cold run interrupted earlier
    build_root="$cache/tmp-root-$$"
    tmpdirs+=("$build_root")
    debootstrap --variant=minbase "$SUITE" "$build_root" "$mirror" >"$cache/debootstrap.log" 2>&1 \
        || { tail -20 "$cache/debootstrap.log"; fail "debootstrap (log: $cache/debootstrap.log)"; }
    echo "debootstrap: $(since "$t") s"
    rm -f "$build_root/etc/apt/sources.list"
    printf '%s' "$sources" >"$build_root/etc/apt/sources.list.d/debian.sources"
    cp /etc/resolv.conf "$build_root/etc/resolv.conf"
    mount -t proc proc "$build_root/proc"; mounts+=("$build_root/proc")
    for r in "${RUNTIME_RUNS[@]}"; do
        echo "RUN $r"
        chroot "$build_root" /usr/bin/env -i PATH="$docker_path" HOME=/root /bin/sh -c "$r" </dev/null \
            || fail "the runtime stage's RUN failed in the root"
    done
    umount "$build_root/proc"; unset 'mounts[-1]'
    rm -rf "$build_root"/var/cache/apt/*.bin "$build_root"/var/cache/apt/archives/*.deb
    : >"$build_root/etc/resolv.conf"
    touch "$build_root/.image-check-complete"
    rm -rf "$root"
    mv "$build_root" "$root"
    tmpdirs=()
fi
t_root=$(since "$t")
install -D -m 0755 "$bin" "$root$BINARY_DEST"
echo "root ready in $t_root s ($cold); binary copied to $BINARY_DEST"
missing=$(chroot "$root" /usr/bin/ldd "$BINARY_DEST" | grep 'not found' || true)
[ -z "$missing" ] || fail "libraries missing in the root: $missing"
echo "every library the binary needs resolves inside the root"
# opqd sets LC_CTYPE to C.UTF-8 (libcurl converts host names outside ASCII only in a UTF-8 locale).
[ -e "$root/usr/lib/locale/C.utf8" ] || fail "the root has no C.UTF-8 locale (/usr/lib/locale/C.utf8): http targets named outside ASCII would fail"
echo "the C.UTF-8 locale opqd sets is in the root"
root_size=$(du -sh --exclude=./proc "$root" | cut -f1)
installed=$(chroot "$root" dpkg-query -W -f '${Package}=${Version}\n' | sort)
for p in "${PACKAGES[@]}"; do
    grep -qxF "$p" <<<"$installed" || fail "package $p (from the Dockerfile) is not installed in the root"
done

# ---------------------------------------------------------------------------------------------
step "4. opqd in the root as USER $IMAGE_USER with the Dockerfile's ENV"
t=$(now)
# USER: a numeric uid takes its passwd entry's group, as in Docker.
uid=$IMAGE_USER
if ! [[ "$uid" =~ ^[0-9]+$ ]]; then uid=$(chroot "$root" id -u "$uid"); fi
gid=$(awk -F: -v u="$uid" '$3 == u { print $4 }' "$root/etc/passwd")
home=$(awk -F: -v u="$uid" '$3 == u { print $6 }' "$root/etc/passwd")
[ -n "$gid" ] || fail "uid $uid has no passwd entry in the root"
[ "$uid" != 0 ] || fail "the runtime stage runs as root"
port=8080
for kv in "${IMAGE_ENV[@]}"; do [[ "$kv" == OPQD_PORT=* ]] && port=${kv#OPQD_PORT=}; done
data_dir=""
for kv in "${IMAGE_ENV[@]}"; do [[ "$kv" == OPQD_DATA=* ]] && data_dir=${kv#OPQD_DATA=}; done
[ -n "$data_dir" ] || fail "the Dockerfile sets no OPQD_DATA"
run_env=(PATH="$docker_path" HOSTNAME=opqd-image-check HOME="${home:-/}" "${IMAGE_ENV[@]}")
echo "uid $uid gid $gid; env: ${run_env[*]}"

# A fresh volume, owned as Docker copies the image's /data into a new named volume.
vol=$(mktemp -d /tmp/opqd-image-volume.XXXXXX); tmpdirs+=("$vol")
chown "$uid:$(stat -c %g "$root$data_dir")" "$vol"; chmod "$(stat -c %a "$root$data_dir")" "$vol"
mount --bind "$vol" "$root$data_dir"; mounts+=("$root$data_dir")
mount -t proc proc "$root/proc"; mounts+=("$root/proc")
logdir=$(mktemp -d /tmp/opqd-image-logs.XXXXXX); tmpdirs+=("$logdir")

# "${in_root[@]}" CMD...: CMD inside the root as the image's user with the image's environment.
in_root=(chroot "$root" /usr/bin/setpriv --reuid="$uid" --regid="$gid" --clear-groups /usr/bin/env -i "${run_env[@]}")
# start_opqd LOG: the ENTRYPOINT in a network namespace of its own; sets $pid.
start_opqd() {
    local log=$1
    : >"$log"
    unshare --net -- /bin/sh -c 'ip link set lo up && exec "$@"' sh \
        "${in_root[@]}" "${ENTRYPOINT[@]}" >"$log" 2>&1 &
    pid=$!
    pids+=("$pid")
    for _ in $(seq 1 150); do
        grep -q "listening on" "$log" && break
        kill -0 "$pid" 2>/dev/null || { cat "$log"; fail "opqd exited at start"; }
        sleep 0.1
    done
    grep -q "listening on" "$log" || { cat "$log"; fail "opqd did not listen within 15 s"; }
    echo "started (pid $pid): $(grep 'listening on' "$log")"
}
# in_ns CMD...: CMD on the host's files in opqd's network namespace (curl from outside, as
# `docker run -p` would reach it).
in_ns() { nsenter --net="/proc/$pid/ns/net" -- "$@"; }
api() {  # api METHOD PATH [BODY]: prints the body, fails unless 2xx
    local out
    out=$(in_ns curl -sS -m 10 -w '\n%{http_code}' -X "$1" "http://127.0.0.1:$port$2" \
        ${3:+-H 'Content-Type: application/json' -d "$3"}) || fail "$1 $2: no answer"
    local code=${out##*$'\n'}
    [[ "$code" == 2* ]] || fail "$1 $2 answered $code: ${out%$'\n'*}"
    printf '%s' "${out%$'\n'*}"
}
# stop_opqd: SIGTERM, exit 0 within 10 s.
stop_opqd() {
    local t0 rc=0
    t0=$(now)
    kill -TERM "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && fail "opqd still running 10 s after SIGTERM"
    wait "$pid" || rc=$?
    pids=("${pids[@]/$pid/}")
    [ "$rc" = 0 ] || { cat "$logdir"/*.log; fail "opqd exited $rc after SIGTERM"; }
    echo "SIGTERM: exited 0 in $(since "$t0") s"
}

start_opqd "$logdir/first.log"

timeout $((HEALTHCHECK_TIMEOUT + 5)) nsenter --net="/proc/$pid/ns/net" -- \
    "${in_root[@]}" "${HEALTHCHECK[@]}" \
    || fail "HEALTHCHECK ${HEALTHCHECK[*]} failed inside the root"
echo "HEALTHCHECK ${HEALTHCHECK[*]}: exit 0, run inside the root as uid $uid"

queue="image-check"
api POST /v1/queues "{\"name\":\"$queue\",\"isSuspended\":true}" >/dev/null
op=$(api POST "/v1/queues/$queue/operations" '{"kind":"delay","spec":{"seconds":1},"name":"survives-restart"}' \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
state=$(api GET "/v1/operations/$op" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
echo "round trip: queue $queue created (suspended), operation $op created, GET status: $state"
# Time zones come from the root's tz database (tzdata): a schedule in Europe/Berlin shows its
# runs at 02:30 local with Berlin's offset (+01:00 in winter, +02:00 in summer).
api POST "/v1/queues/$queue/schedules" \
    '{"name":"berlin","cron":"30 2 * * *","timezone":"Europe/Berlin","operation":{"kind":"delay","spec":{"seconds":1}},"isPaused":true}' >/dev/null
local_times=$(api GET "/v1/queues/$queue/schedules/berlin/next?count=2" \
    | python3 -c 'import json,sys; print(" ".join(r["localTime"] for r in json.load(sys.stdin)["runs"]))')
for lt in $local_times; do
    [[ "$lt" == *T02:30:00+01:00 || "$lt" == *T02:30:00+02:00 ]] || fail "a Europe/Berlin schedule's run at $lt: the root's tz database is not read"
done
echo "schedule in Europe/Berlin inside the root: next runs $local_times"
stop_opqd
ls -ln "$vol" | sed 's/^/    \/data: /'
[ -n "$(find "$vol" -mindepth 1 -user "$uid" -print -quit)" ] || fail "opqd left nothing owned by uid $uid in $data_dir"

start_opqd "$logdir/second.log"
api GET "/v1/queues/$queue" >/dev/null
state2=$(api GET "/v1/operations/$op" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["state"], d.get("name"))')
echo "after restart: queue $queue there, operation $op: $state2"
stop_opqd
# Nothing listens now: the healthcheck must say so (non-zero, one line). In an empty network
# namespace, so that nothing else on this machine's port can answer for it.
if reason=$(timeout $((HEALTHCHECK_TIMEOUT + 5)) unshare --net -- "${in_root[@]}" "${HEALTHCHECK[@]}" 2>&1); then
    fail "HEALTHCHECK exited 0 with no server running"
fi
echo "HEALTHCHECK with no server: non-zero, \"$reason\""
t_run=$(since "$t")

# ---------------------------------------------------------------------------------------------
step "summary"
echo "hadolint:     clean"
echo "binary build: $t_build s"
echo "root:         $t_root s ($cold), $root_size at $root"
echo "run checks:   $t_run s"
echo "total:        $(since "$t_start") s ($cold run)"
echo "packages in the root ($(wc -l <<<"$installed")):"
echo "$installed" | tr '\n' ' ' | fold -s -w 100 | sed 's/^/    /'
echo
echo "image-check: passed"
