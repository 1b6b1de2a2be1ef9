#!/bin/sh
# Capture this node's tool output into DIR for `llmgw node doctor --from DIR` (docs/doctor-captures.md).
# Each file: "# $ command", the command's stdout and stderr, "# exit=N" (127: the tool is not installed).
# Reads only; run as root to include the kernel log where dmesg is restricted. Usage: capture-node.sh DIR
set -u
dir=${1:?usage: capture-node.sh DIR}
mkdir -p "$dir" || exit 1
tmp=$(mktemp) || exit 1
trap 'rm -f "$tmp"' EXIT

cap() {  # cap FILE COMMAND ARGS...: run COMMAND (60 s at most) into DIR/FILE, framed
    file=$1
    shift
    timeout 60 "$@" >"$tmp" 2>&1
    status=$?
    {
        printf '# $ %s\n' "$*"
        cat "$tmp"
        [ -n "$(tail -c 1 "$tmp")" ] && echo
        printf '# exit=%s\n' "$status"
    } >"$dir/$file"
}

cap hostname.txt hostname
cap uname.txt uname -a
cap proc-meminfo.txt cat /proc/meminfo
cap nvidia-smi-q-x.xml nvidia-smi -q -x
cap nvidia-smi-L.txt nvidia-smi -L
cap nvidia-smi-topo-m.txt nvidia-smi topo -m
cap nvidia-smi-nvlink-e.txt nvidia-smi nvlink -e
cap journalctl-k.txt journalctl -k -b --no-pager -o short-iso
cap dmesg.txt dmesg
cap lspci-vv.txt lspci -vv -d 10de:
cap ibstat.txt ibstat
if [ -d /etc/nvidia-imex ]; then
    cap nvidia-imex-ctl-N-j.json nvidia-imex-ctl -N -j -H
fi
mapped=""
for port in /sys/class/infiniband/*/ports/*; do
    [ -d "$port" ] || continue
    ca=$(basename "$(dirname "$(dirname "$port")")")
    p=$(basename "$port")
    cap "sminfo-$ca-$p.txt" sminfo -C "$ca" -P "$p"
    cap "saquery-smir-$ca-$p.txt" saquery SMIR -C "$ca" -P "$p"
    if [ -z "$mapped" ] && grep -q ACTIVE "$port/state" 2>/dev/null; then
        cap ibnetdiscover.txt ibnetdiscover -C "$ca" -P "$p"
        mapped=yes
    fi
done
echo "captured into $dir: send it with the support case, or read it with: llmgw node doctor --from $dir"
