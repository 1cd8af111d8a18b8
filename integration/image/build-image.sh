#!/usr/bin/env bash
# Build the VM suite's base image into OUTDIR (which must not exist): a Debian SUITE root (bookworm or trixie;
# the package names below are the same in both) with systemd,
# a kernel, python3 and the Debian packages elasticd depends on (./packages), plus the suite's driver unit
# (./files). Output: OUTDIR/disk.raw (ext4, label "root", the whole disk: /dev/vda in the guest, so io.max
# has a real device to limit), OUTDIR/vmlinuz, OUTDIR/initrd.img, OUTDIR/manifest.txt (versions).
#
# integration/run.py calls this only when the hash of this script, ./packages and ./files changes, and
# keeps the result outside the checkout; each run boots a copy-on-write overlay over disk.raw.
#
# Runs as root (mmdebstrap --mode=root, and mkfs.ext4 -d keeps the files' owners). The host's mounts are
# never touched: mmdebstrap runs in its own mount and pid namespaces (unshare), so the one file system it
# mounts into the new root, a fresh read-only proc, shows only that namespace's processes and vanishes
# with it; /sys is not mounted at all (--skip=chroot/mount/sys), and nothing of the host's /proc, /sys or
# cgroup tree is bind-mounted into the chroot.
set -euo pipefail
export PATH=/usr/sbin:/usr/bin:/sbin:/bin

here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build-image.sh OUTDIR SUITE}
suite=${2:?usage: build-image.sh OUTDIR SUITE}
case "$suite" in
    bookworm|trixie) ;;
    *) echo "build-image: unknown suite '$suite' (bookworm or trixie)" >&2; exit 2 ;;
esac
mirror=${ELASTICD_IT_MIRROR:-http://deb.debian.org/debian}
disk_size=${ELASTICD_IT_DISK_SIZE:-2G}

if [ -e "$out" ]; then
    echo "build-image: $out exists" >&2
    exit 1
fi
mkdir -p "$out"
root="$out/root"
packages=$(sed -e 's/#.*//' "$here/packages" | tr -s ' \t\n' '\n' | grep -v '^$' | paste -sd, -)

echo "build-image: mmdebstrap $suite from $mirror" >&2
unshare --mount --pid --fork --kill-child --propagation private \
    mmdebstrap --mode=root --variant=minbase --skip=chroot/mount/sys --include="$packages" \
    "$suite" "$root" "deb $mirror $suite main"

echo "build-image: configuring the guest" >&2
cp -a "$here/files/." "$root/"
echo elasticd-it >"$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\telasticd-it\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
printf 'LABEL=root\t/\text4\trw,relatime\t0\t0\n' >"$root/etc/fstab"
# A fixed machine id: every run boots a fresh overlay of the same image, and an empty one would make each
# boot a "first boot" (presets, firstboot) the suite does not want to wait for.
echo 5e1a57cd0000400080000000000000a1 >"$root/etc/machine-id"
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
ln -sf /etc/systemd/system/elasticd-it.service "$root/etc/systemd/system/multi-user.target.wants/elasticd-it.service"
# Nothing that would run on its own timer or want a login in the middle of a measurement. The prometheus
# package enables its own server (0.0.0.0:9090, scraping itself every 15 s, burning emulated CPU from boot on):
# the accounting scenario runs the binary itself, on loopback, only while it measures.
for unit in apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer fstrim.timer \
            serial-getty@ttyS0.service getty@tty1.service prometheus.service; do
    ln -sf /dev/null "$root/etc/systemd/system/$unit"
done

cp "$root"/boot/vmlinuz-* "$out/vmlinuz"
cp "$root"/boot/initrd.img-* "$out/initrd.img"
{
    echo "suite: $suite ($mirror)"
    echo "kernel: $(basename "$root"/boot/vmlinuz-*)"
    dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Package} ${Version}\n' \
        systemd linux-image-amd64 python3 python3-aiohttp python3-psutil python3-ruamel.yaml \
        python3-prometheus-client python3-pystemd python3-httptools python3-uvloop prometheus
} >"$out/manifest.txt"

echo "build-image: mkfs.ext4 ($disk_size)" >&2
mkfs.ext4 -q -d "$root" -L root "$out/disk.raw" "$disk_size"
rm -rf "$root"
echo "build-image: done: $out" >&2
cat "$out/manifest.txt" >&2
