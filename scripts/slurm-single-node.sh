#!/usr/bin/env bash
# Start a real single-node Slurm on this machine (munged, slurmctld, slurmd) for perfgate's Slurm tests
# and for trying the Slurm launcher by hand. Idempotent: exits 0 at once when this machine's node is
# already idle. Needs root and Debian's `slurm-wlm` and `munge` packages. Works without systemd and
# without cgroups (proctrack/linuxproc, task/none, no accounting).
#
#   scripts/slurm-single-node.sh          start (or confirm) and wait for the node to be idle
#   scripts/slurm-single-node.sh --stop   stop the daemons this script started
#
# State lives under $PERFGATE_SLURM_DIR (default /tmp/perfgate-slurm); the configuration is written to
# /etc/slurm/slurm.conf unless a configuration that this script did not write is already there.
set -euo pipefail

state="${PERFGATE_SLURM_DIR:-/tmp/perfgate-slurm}"
conf=/etc/slurm/slurm.conf
marker="# written by perfgate scripts/slurm-single-node.sh"
host="$(hostname -s)"

say() { echo "slurm-single-node: $*" >&2; }

stop() {
    for name in slurmd slurmctld; do
        if [ -f "$state/$name.pid" ]; then
            pid="$(cat "$state/$name.pid")"
            if kill -0 "$pid" 2>/dev/null; then kill "$pid"; fi
            rm -f "$state/$name.pid"
        fi
    done
}

if [ "${1:-}" = "--stop" ]; then
    stop
    exit 0
fi

for tool in munged slurmctld slurmd sinfo srun; do
    command -v "$tool" >/dev/null 2>&1 || { say "$tool not found (apt-get install slurm-wlm munge)"; exit 1; }
done
[ "$(id -u)" = 0 ] || { say "needs root to start munged, slurmctld and slurmd"; exit 1; }

node_idle() { sinfo -h -N -n "$host" -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; }

if [ -f "$conf" ] && node_idle; then
    say "node $host already up"
    exit 0
fi

mkdir -p "$state/ctld" "$state/spool" "$state/log"

# munge: the key the package made, or a new one; munged runs as the munge user.
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    fi
    chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown munge:munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
    if id munge >/dev/null 2>&1; then
        runuser -u munge -- /usr/sbin/munged || /usr/sbin/munged --force
    else
        /usr/sbin/munged --force
    fi
    for _ in $(seq 50); do
        munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.1
    done
    munge -n </dev/null | unmunge >/dev/null || { say "munged did not start"; exit 1; }
fi

# The node line is what slurmd measures here, so the node never drains for a size mismatch. Daemons
# and jobs talk over loopback: a container's host name need not resolve.
node_line="$(slurmd -C | head -n 1)"
case "$node_line" in
    NodeName=*) ;;
    *) say "slurmd -C gave no node line: $node_line"; exit 1 ;;
esac

if [ -f "$conf" ] && ! grep -qF "$marker" "$conf"; then
    say "$conf exists and was not written by this script; leaving it alone"
else
    mkdir -p /etc/slurm
    cat >"$conf" <<CONF
$marker
ClusterName=perfgate
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=30
$node_line NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
fi

running() { [ -f "$state/$1.pid" ] && kill -0 "$(cat "$state/$1.pid")" 2>/dev/null; }

running slurmctld || slurmctld -c   # -c: start clean, no jobs from an earlier run
for _ in $(seq 100); do
    scontrol ping 2>/dev/null | grep -q UP && break
    sleep 0.2
done
running slurmd || slurmd

for _ in $(seq 150); do
    if node_idle; then
        say "node $host idle"
        exit 0
    fi
    state_now="$(sinfo -h -N -n "$host" -o '%t' 2>/dev/null || true)"
    case "$state_now" in
        down*|drain*|drng*) scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 0.2
done
say "node $host did not become idle; see $state/log/"
sinfo -N >&2 || true
tail -n 20 "$state/log/slurmctld.log" "$state/log/slurmd.log" >&2 || true
exit 1
