# Shared by packaging/build-root/build-root and packaging/suite-root/suite-root (sourced, not run): a Debian root of
# one release, made by mmdebstrap once and cached outside the checkout, then entered with chroot in namespaces of
# its own. The two roots are made and cached separately (the build root holds the buildd essentials, the
# Build-Depends and lintian; the test root the runtime and the tests' tools); only the making and the entering
# are shared.
#
# The host is never touched: mmdebstrap runs in its own mount and pid namespaces with no /sys in the chroot, and
# entering a root makes private mount, pid and cgroup namespaces whose mounts live and die with them: a fresh proc
# (this namespace's processes only), a fresh read-only sysfs with no cgroup file system under it (nothing in a root
# can see, let alone write, the machine's cgroups), the host's /dev (bind: null, urandom, ttys), a fresh tmpfs at
# /dev/shm, /tmp and /run, and SRC bound at /src. PID 1 of the new pid namespace is tini when the root has it (it
# reaps orphans as the host's init does), else the command itself.

# The cache: $ELASTICD_ROOT_CACHE (default /var/cache/elasticd-roots)/<name>-<key>; two are kept per name.
root_cache=${ELASTICD_ROOT_CACHE:-/var/cache/elasticd-roots}
root_mirror=${ELASTICD_ROOT_MIRROR:-http://deb.debian.org/debian}
root_keep=2

root_check_suite() {
    case "$1" in
        bookworm|trixie) ;;
        *) echo "$root_tool: unknown suite '$1' (bookworm or trixie)" >&2; exit 2 ;;
    esac
}

root_need_root() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "$root_tool: run as root (mmdebstrap --mode=root, chroot)" >&2
        exit 1
    fi
}

# root_ensure NAME KEY WHAT MAKE_FUNCTION: the root $root_cache/NAME-KEY, made by `MAKE_FUNCTION PARTIAL LOG` when
# absent (WHAT says what it is, for the message); its path on stdout. The key is the caller's hash over everything
# that decides the root's content, so a change of any makes a new root; the older ones beyond $root_keep go.
root_ensure() {
    local name=$1 key=$2 what=$3 make=$4 target partial log
    target="$root_cache/$name-$key"
    mkdir -p "$root_cache"
    exec 9>"$root_cache/.lock"
    flock 9  # two runs at once: one makes it, the other waits and uses it
    if [ ! -e "$target/complete" ]; then
        partial="$target.partial"
        log="$root_cache/$name.log"
        rm -rf "$partial" "$target"
        echo "$root_tool: making $what $target (mmdebstrap from $root_mirror, a minute or two)" >&2
        local began=$SECONDS attempt=1
        # A root is made from the network: a mirror in the middle of its sync answers "Hash Sum mismatch" or a 404
        # for a while, and a failed fetch is not the build's fault. So a failure is tried again, twice, after 30 and
        # 90 s; each failure's log tail is shown, and the third is final.
        until "$make" "$partial" "$log"; do
            tail -n 30 "$log" >&2
            rm -rf "$partial"
            if [ "$attempt" -ge 3 ]; then
                echo "$root_tool: making $what failed $attempt times; the whole log is $log" >&2
                exit 1
            fi
            local pause=$((attempt == 1 ? 30 : 90))
            echo "$root_tool: making $what failed (attempt $attempt of 3); trying again in $pause s" >&2
            sleep "$pause"
            attempt=$((attempt + 1))
        done
        mv "$partial" "$target"
        date -u +%FT%TZ >"$target/complete"
        echo "$root_tool: made in $((SECONDS - began)) s" >&2
        ls -1dt "$root_cache/$name"-*/ 2>/dev/null | tail -n +$((root_keep + 1)) | while read -r old; do
            echo "$root_tool: removing the old root $old" >&2
            rm -rf "$old"
        done
    fi
    touch "$target"
    exec 9>&-
    echo "$target"
}

# root_mmdebstrap PARTIAL LOG SUITE VARIANT [MMDEBSTRAP OPTION...]: mmdebstrap in its own mount and pid namespaces,
# with no /sys in the chroot (its hooks run there too).
root_mmdebstrap() {
    local partial=$1 log=$2 suite=$3 variant=$4
    shift 4
    unshare --mount --pid --fork --kill-child --propagation private \
        mmdebstrap --mode=root --variant="$variant" --skip=chroot/mount/sys "$@" \
        "$suite" "$partial" "deb $root_mirror $suite main" >"$log" 2>&1
}

# root_enter ROOT SRC NETWORK CMD [ARG...]: run CMD in ROOT as root, with SRC at /src (its cwd), a clean
# environment, and the host's network (NETWORK=host) or none but a loopback that is down (NETWORK=none: a
# network namespace of its own, as Debian's buildds build). $ROOT_ENTER_CACHE, when set, names a directory of the
# host's bound at the same path in the root. Replaces the shell.
root_enter() {
    local root=$1 src=$2 network=$3 netns=()
    shift 3
    [ "$network" = none ] && netns=(--net)
    exec unshare --mount --pid --cgroup "${netns[@]}" --fork --kill-child --propagation private \
        /bin/bash -euc '
            root=$1 src=$2 cache=$3; shift 3
            # The root a mount of its own, first: bubblewrap (isolated tenants in the tests) makes "/" a slave
            # and pivots out of it, which a chroot into a bare directory refuses ("Failed to make / slave").
            mount --bind "$root" "$root"
            mount -t proc proc "$root/proc"
            mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys"
            mount --rbind /dev "$root/dev"
            mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
            mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
            mount -t tmpfs -o mode=0755 tmpfs "$root/run"
            mkdir -p "$root/src"
            mount --bind "$src" "$root/src"
            if [ -n "$cache" ]; then
                mkdir -p "$root$cache"
                mount --bind "$cache" "$root$cache"
            fi
            init=()
            [ -x "$root/usr/bin/tini" ] && init=(/usr/bin/tini -s -g --)
            exec chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
                PATH=/usr/sbin:/usr/bin:/sbin:/bin "${init[@]}" \
                /bin/sh -c "cd /src && exec \"\$@\"" sh "$@"
        ' root-enter "$root" "$src" "${ROOT_ENTER_CACHE:-}" "$@"
}
