#!/bin/bash
# Run both units of this directory under a real systemd (PID 1 of its own namespaces, on a Debian root) with a
# release installed from its wheels alone, and check that they work with all their hardening: the control plane
# answers and sees the agent connected, both come back after a restart and after SIGKILL, the state directories keep
# their owners, and a probe unit with the agent's exact [Service] options runs nft, useradd and a switch to the new
# user. docs/install.md ("Units") has what it printed. Not part of `make test`: the first run makes the Debian root
# (debootstrap, about 2.5 minutes, cached in $LLMGW_CACHE/units-root), later runs take about a minute.
#
#     deploy/systemd/boot-check.sh RELEASE_DIR        (as root; RELEASE_DIR from `llmgw release build`)
#
# Needs: debootstrap, unshare, nsenter, pivot_root (util-linux), overlayfs, network for the first debootstrap.
set -euo pipefail
release=$(realpath "${1:?usage: boot-check.sh RELEASE_DIR}")
units=$(dirname "$(realpath "$0")")
cache=${LLMGW_CACHE:-$HOME/.cache/llmgw}/units-root
[ "$(id -u)" = 0 ] || { echo "boot-check.sh runs as root (namespaces, mounts, chroot)" >&2; exit 1; }
if [ ! -x "$cache/lib/systemd/systemd" ]; then
    rm -rf "$cache.tmp"
    debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,python3,python3-venv,curl,nftables \
        bookworm "$cache.tmp" http://deb.debian.org/debian >/dev/null
    mv "$cache.tmp" "$cache"
fi
scratch=$(mktemp -d /tmp/llmgw-boot-check.XXXXXX)
trap 'kill -KILL "$boot" 2>/dev/null || true; sleep 1; rm -rf "$scratch"' EXIT  # unshare ignores SIGTERM; its child dies with it (--kill-child)
mkdir -p "$scratch/root" "$scratch/rw"
# Set-up inside the namespace (mount overlay, install the release, write the units), then systemd as PID 1.
cat >"$scratch/inside.sh" <<EOF
set -euo pipefail
mount -t tmpfs tmpfs "$scratch/rw"
mkdir -p "$scratch/rw/upper" "$scratch/rw/work"
mount -t overlay overlay -o lowerdir="$cache",upperdir="$scratch/rw/upper",workdir="$scratch/rw/work" "$scratch/root"
R="$scratch/root"
mkdir -p "\$R/root/release" && cp -r "$release"/. "\$R/root/release/"
cp "$units"/*.service "\$R/etc/systemd/system/"
mount -t proc proc "\$R/proc"
chroot "\$R" /bin/bash -e -c '
  version=\$(ls /root/release/wheels | sed -n "s/^llmgw-\([^-]*\)-.*/\1/p")
  python3 -m venv /opt/llmgw/\$version
  PIP_CONFIG_FILE=/dev/null /opt/llmgw/\$version/bin/pip install -q --no-index --find-links /root/release/wheels llmgw
  ln -sfn /opt/llmgw/\$version /opt/llmgw/current
  useradd --system --home-dir /var/lib/llmgw/server --shell /usr/sbin/nologin llmgw
  mkdir -p /etc/llmgw
  echo "LLMGW_SERVER_OPTIONS=--repo /var/lib/llmgw/server/settings.git --gateway 127.0.0.1:28080 --admin 127.0.0.1:28081 --agents 127.0.0.1:28082" >/etc/llmgw/server.env
  echo "LLMGW_AGENT_OPTIONS=--control-plane 127.0.0.1:28082 --node-id box1 --insecure" >/etc/llmgw/agent.env
  /opt/llmgw/current/bin/llmgw repo init /var/lib/llmgw/server/settings.git >/dev/null
  for u in systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket getty@tty1.service \
           console-getty.service systemd-timesyncd.service apt-daily.timer apt-daily-upgrade.timer e2scrub_reap.service \
           systemd-firstboot.service systemd-logind.service; do ln -sf /dev/null /etc/systemd/system/\$u; done
  systemctl enable -q llmgw-server.service llmgw-agent.service
  echo box1 >/etc/hostname; : >/etc/machine-id
'
umount "\$R/proc"
# The probe: the agent's [Service] options, running what the agent runs as root.
sed -e 's/^Type=exec/Type=oneshot/' -e '/^Restart=always/d' -e '/^EnvironmentFile=/d' \
    -e "s|^ExecStart=.*|ExecStart=/bin/sh -c 'nft add table inet llmgw_probe \&\& useradd -M -u 2345 probeuser \&\& setpriv --reuid=probeuser --regid=probeuser --init-groups id -un \&\& echo PROBE-OK'|" \
    "$units/llmgw-agent.service" >"\$R/etc/systemd/system/llmgw-agent-probe.service"
ip link set lo up
cd "\$R" && mkdir -p oldroot && pivot_root . oldroot
exec /usr/bin/env container=other /lib/systemd/systemd --system --log-color=no
EOF
started=$(date +%s)
unshare --pid --mount --net --uts --ipc --fork --kill-child=SIGKILL --propagation private bash "$scratch/inside.sh" \
    >"$scratch/boot.log" 2>&1 &
boot=$!
disown "$boot"  # no "Killed" line from bash when the trap ends it
in_box() { nsenter -t "$(pgrep -P "$boot")" -a /bin/bash -c "$1"; }
status() { in_box 'curl -s -H "Authorization: Bearer $(cat /var/lib/llmgw/server/admin-token)" http://127.0.0.1:28081/api/v1/status'; }
for _ in $(seq 120); do
    status 2>/dev/null | grep -q '"box1": {"state": "connected"' && break
    kill -0 "$boot" 2>/dev/null || { cat "$scratch/boot.log"; exit 1; }
    sleep 1
done
status | grep -q '"box1": {"state": "connected"' || { in_box 'systemctl --no-pager status llmgw-server llmgw-agent; journalctl --no-pager -n 40'; exit 1; }
echo "up: the control plane answers and the agent is connected, $(( $(date +%s) - started )) s after the start (set-up included)"
in_box 'systemctl restart llmgw-server.service llmgw-agent.service && kill -9 $(systemctl show -p MainPID --value llmgw-agent.service)'
for _ in $(seq 60); do status 2>/dev/null | grep -q '"box1": {"state": "connected"' && break; sleep 1; done
status | grep -q '"box1": {"state": "connected"' || { in_box 'journalctl --no-pager -n 40'; exit 1; }
echo "restart of both, then SIGKILL of the agent: both back, the agent connected again"
in_box 'stat -c "%U:%G %a %n" /var/lib/llmgw/server /var/lib/llmgw/agent /var/lib/llmgw/engines /var/lib/llmgw/weights'
in_box 'systemctl start llmgw-agent-probe.service; journalctl --no-pager -o cat -u llmgw-agent-probe.service | grep -E "^(table|probeuser|PROBE)" || true'
in_box 'journalctl --no-pager -o cat -u llmgw-agent-probe.service' | grep -q PROBE-OK || { echo "the probe failed"; exit 1; }
in_box 'for u in llmgw-server llmgw-agent; do systemd-analyze security --no-pager $u.service | tail -1; done'
echo "boot-check: all passed"
