#!/usr/bin/env bash
# A real two-node SLURM on this machine, for the tests and CI (issue 50): Debian's slurm-wlm and
# munge, one slurmctld and two slurmd (nodes n1 and n2, each its own port, pid file and spool
# through %n) on the loopback, with a private SLURM_CONF, state folder, munge socket and ports
# outside 15000-24999 (where Lightning picks its DDP port from the job id). Accounting as real
# clusters keep it: slurmdbd over a private MariaDB (its own data folder, socket and port), so
# sacct answers. Debian's cron beside it, as on a login node, for scheduled sweeps. It never
# touches a cluster, a database or a cron it did not start.
#
#   tools/slurm/cluster.sh up      # install what is missing (as root), start, wait until both
#                                  # nodes are idle; prints the SLURM_CONF line to export
#   tools/slurm/cluster.sh down    # stop what `up` started
#   tools/slurm/cluster.sh status  # sinfo of this cluster
#
# REPRODUCE_SLURM_DIR (default /tmp/reproduce-slurm) holds everything. `up` is idempotent.
set -euo pipefail

DIR=${REPRODUCE_SLURM_DIR:-/tmp/reproduce-slurm}
CONF=$DIR/slurm.conf
CTLD_PORT=6817
NODE_PORTS=(6818 6819)
DB_PORT=6820
DBD_PORT=6821
NODES=(n1 n2)

say() { echo "slurm cluster: $*" >&2; }

# whether the daemon whose pid file is $1 runs
running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

install() {
    if command -v slurmctld >/dev/null && command -v munged >/dev/null \
            && command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null \
            && command -v cron >/dev/null; then
        return
    fi
    if [ "$(id -u)" != 0 ]; then
        say "slurm-wlm, slurmdbd, munge, mariadb-server and cron are not all installed, and" \
            "installing them needs root"
        exit 1
    fi
    say "installing slurm-wlm, slurmdbd, munge, mariadb-server and cron (Debian's packages)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm slurmdbd munge mariadb-server \
        cron >/dev/null
}

# cron, as on a login node, for scheduled sweeps (docs/cluster.md): the machine's own if one
# runs (left alone by `down`), else Debian's cron started here, its pid kept for `down`
start_cron() {
    local pid
    pid=$(pgrep -x cron | head -1) || true
    if [ -n "$pid" ]; then  # ours from an earlier `up`, or the machine's: not ours to stop
        [ "$(cat "$DIR/cron.pid" 2>/dev/null)" = "$pid" ] || rm -f "$DIR/cron.pid"
        return
    fi
    cron
    for _ in $(seq 10); do
        if [ -f /run/crond.pid ]; then cp /run/crond.pid "$DIR/cron.pid"; return; fi
        sleep 0.5
    done
    say "cron did not start (no /run/crond.pid after 5 s)"
    exit 1
}

write_conf() {
    local host cpus mem
    host=$(hostname)
    cpus=$(nproc)
    # what slurmd -C reports for this machine, shared by both nodes (they are the same machine)
    mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
    cat >"${1:-$CONF}" <<EOF
ClusterName=reproduce
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
ReturnToService=2
SlurmdTimeout=30
SlurmctldTimeout=30
KillWait=5
MinJobAge=30
InactiveLimit=0
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$DIR/munge/munge.socket
NodeName=${NODES[0]} NodeHostname=$host NodeAddr=127.0.0.1 Port=${NODE_PORTS[0]} CPUs=$cpus RealMemory=$mem State=UNKNOWN
NodeName=${NODES[1]} NodeHostname=$host NodeAddr=127.0.0.1 Port=${NODE_PORTS[1]} CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=${NODES[0]},${NODES[1]} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
PartitionName=short Nodes=${NODES[0]},${NODES[1]} MaxTime=5 State=UP OverSubscribe=YES
EOF
}

start_munge() {
    local m=$DIR/munge
    if [ -S "$m/munge.socket" ] && munge -S "$m/munge.socket" -n </dev/null >/dev/null 2>&1; then
        return
    fi
    mkdir -p "$m"
    chmod 700 "$m"
    [ -f "$m/munge.key" ] || dd if=/dev/urandom of="$m/munge.key" bs=1 count=1024 status=none
    chmod 400 "$m/munge.key"
    munged --force --socket="$m/munge.socket" --key-file="$m/munge.key" \
        --pid-file="$m/munged.pid" --log-file="$m/munged.log" --seed-file="$m/munged.seed"
}

# A MariaDB of our own for slurmdbd: its data folder, socket and port (root by the socket only)
start_db() {
    local db=$DIR/mysql
    if ! running "$db/mariadbd.pid"; then
        mkdir -p "$db"
        [ -d "$db/data/mysql" ] || mariadb-install-db --no-defaults --datadir="$db/data" \
            --user=root --auth-root-authentication-method=socket --skip-test-db \
            >"$DIR/log/mariadb-install.log" 2>&1
        mariadbd --no-defaults --user=root --datadir="$db/data" --socket="$db/mysqld.sock" \
            --port=$DB_PORT --bind-address=127.0.0.1 --pid-file="$db/mariadbd.pid" \
            --log-error="$DIR/log/mariadbd.log" --skip-log-bin --innodb-buffer-pool-size=32M \
            >/dev/null 2>&1 &
    fi
    for _ in $(seq 30); do
        mariadb --no-defaults -S "$db/mysqld.sock" -u root -e "CREATE USER IF NOT EXISTS
            'slurm'@'127.0.0.1' IDENTIFIED BY 'reproduce'; GRANT ALL ON slurm_acct_db.* TO
            'slurm'@'127.0.0.1'" 2>/dev/null && return
        sleep 1
    done
    say "MariaDB did not start in 30 s; its log is $DIR/log/mariadbd.log"
    exit 1
}

# slurmdbd (the accounting daemon) on that database, reading slurmdbd.conf beside $SLURM_CONF;
# the cluster registered with it
start_dbd() {
    local conf=$DIR/slurmdbd.conf
    printf '%s\n' "AuthType=auth/munge" "AuthInfo=socket=$DIR/munge/munge.socket" \
        "DbdHost=localhost" "DbdAddr=127.0.0.1" "DbdPort=$DBD_PORT" "SlurmUser=root" \
        "StorageType=accounting_storage/mysql" "StorageHost=127.0.0.1" "StoragePort=$DB_PORT" \
        "StorageUser=slurm" "StoragePass=reproduce" "StorageLoc=slurm_acct_db" \
        "PidFile=$DIR/slurmdbd.pid" "LogFile=$DIR/log/slurmdbd.log" >"$conf.new"
    chmod 600 "$conf.new"
    if cmp -s "$conf.new" "$conf"; then
        rm "$conf.new"
    else
        mv "$conf.new" "$conf"
        stop "$DIR/slurmdbd.pid" || exit 1
    fi
    if ! running "$DIR/slurmdbd.pid"; then
        slurmdbd
    fi
    for _ in $(seq 30); do
        if sacctmgr -n show cluster format=cluster 2>/dev/null | grep -qw reproduce; then
            return
        fi
        sacctmgr -i add cluster reproduce >/dev/null 2>&1 || true
        sleep 1
    done
    say "slurmdbd did not answer in 30 s; its log is $DIR/log/slurmdbd.log"
    exit 1
}

idle() {
    local states
    states=$(SLURM_CONF=$CONF sinfo -h -N -o '%N %t' 2>/dev/null | sort -u) || return 1
    for n in "${NODES[@]}"; do
        grep -q "^$n idle" <<<"$states" || return 1
    done
}

resolve_nodes() {
    # Tasks find each other by node name (SLURM_NODELIST: Lightning's MASTER_ADDR), as on a real
    # cluster: n1 and n2 must resolve, here to the loopback.
    local n
    for n in "${NODES[@]}"; do
        getent hosts "$n" >/dev/null && continue
        if [ "$(id -u)" != 0 ]; then
            say "node name $n does not resolve; add '127.0.0.1 ${NODES[*]}' to /etc/hosts"
            exit 1
        fi
        echo "127.0.0.1 $n  # reproduce's test cluster (tools/slurm/cluster.sh)" >>/etc/hosts
    done
}

up() {
    install
    resolve_nodes
    mkdir -p "$DIR/state" "$DIR/log" "$DIR/spool/${NODES[0]}" "$DIR/spool/${NODES[1]}"
    start_munge
    # this script's slurm.conf: a cluster started by an older one gets it, and rereads it
    local changed=0
    write_conf "$CONF.new"
    if cmp -s "$CONF.new" "$CONF"; then rm "$CONF.new"; else mv "$CONF.new" "$CONF"; changed=1; fi
    export SLURM_CONF=$CONF
    start_db
    start_dbd
    if [ "$changed" = 1 ] && [ -f "$DIR/slurmctld.pid" ]; then
        # restarted, not reconfigured: plugins (JobCompType) load when slurmctld starts
        stop "$DIR/slurmctld.pid" || exit 1
    fi
    if ! running "$DIR/slurmctld.pid"; then
        slurmctld -f "$CONF"
        [ "$changed" = 1 ] && { sleep 2; scontrol reconfigure || true; }  # the nodes reread it
    fi
    for n in "${NODES[@]}"; do
        if ! running "$DIR/slurmd-$n.pid"; then
            slurmd -f "$CONF" -N "$n"
        fi
    done
    start_cron
    for _ in $(seq 60); do
        if idle; then
            say "up: nodes ${NODES[*]} idle"
            echo "export SLURM_CONF=$CONF"
            return
        fi
        sleep 1
    done
    say "the nodes did not become idle in 60 s; logs in $DIR/log"
    SLURM_CONF=$CONF sinfo -N >&2 || true
    exit 1
}

# SIGTERM to the daemon whose pid file is $1, and up to 30 s for it to end; says so if it does not
stop() {
    local pid
    [ -f "$1" ] && pid=$(cat "$1") || return 0
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || return 0; sleep 1; done
    say "$(basename "$1" .pid) (pid $pid) still runs 30 s after SIGTERM; logs in $DIR/log"
    return 1
}

down() {
    local failed=0
    for pid in "$DIR"/slurmd-*.pid "$DIR/slurmctld.pid" "$DIR/slurmdbd.pid" \
            "$DIR/mysql/mariadbd.pid" "$DIR/munge/munged.pid" "$DIR/cron.pid"; do
        stop "$pid" || failed=1
    done
    [ "$failed" = 0 ] || exit 1
    say "down"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) SLURM_CONF=$CONF sinfo -N ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
