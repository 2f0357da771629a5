#!/usr/bin/env bash
# Bring up a single-node Slurm 22.05 cluster with accounting (Debian 12 packages), as root, without systemd or
# cgroups: munged, MariaDB (own datadir), slurmdbd, slurmctld, slurmd, all started by hand and tracked by pid.
# Idempotent: starts only what is not running; returns at once when everything is already up.
#
# Usage: scripts/slurm-up.sh          then: source "$SLURM_LAB/env.sh"   (exports SLURM_CONF)
# Env:   see scripts/slurm-lib.sh (SLURM_LAB default /tmp/evalrun-slurm, SLURM_PORT_BASE default 6817,
#        SLURM_CLUSTER_NAME). A second lab: SLURM_LAB=/tmp/evalrun-slurm-b SLURM_PORT_BASE=6917 scripts/slurm-up.sh
# Stop:  scripts/slurm-down.sh [--purge];  only the controller: scripts/slurmctld.sh stop|start
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/slurm-lib.sh"
lock
t0=$(date +%s%N)
elapsed() { local ms=$(( ($(date +%s%N) - t0) / 1000000 )); printf '%d.%02d' $((ms / 1000)) $((ms % 1000 / 10)); }

# a lab started by an older script from a directory deleted since: restart those daemons (see daemon-lib start)
for d in slurmd slurmctld slurmdbd; do
  if alive "$d" && cwd_gone "$d"; then echo "slurm-up: restarting $d (its working directory was deleted)"; stop "$d"; fi
done

if alive mariadbd && alive slurmdbd && alive slurmctld && alive slurmd && ctld_up && node_ready && node_has_gpus &&
    munge -n </dev/null >/dev/null 2>&1; then
  echo "slurm-up: already up (SLURM_CONF=$SLURM_CONF)"; exit 0
fi

# --- packages (only the missing ones)
need=""
for p in slurmctld slurmd slurm-client munge slurmdbd mariadb-server; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need="$need $p"
done
if [ -n "$need" ]; then
  echo "slurm-up: installing$need"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $need >/dev/null
  echo "slurm-up: packages installed at $(elapsed)s"
fi

mkdir -p "$LAB"/{etc,state,spool,log,run,pids,mysql,dev}
# Describe the node exactly as slurmd sees it (RealMemory a bit lower so the node is never drained for it). Every lab
# on this host offers all its CPUs: labs side by side share them as their jobs' processes share any CPU (task/none).
eval "$(slurmd -C | head -1 | tr ' ' '\n' | grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore|RealMemory)=')"
MEM=$(( RealMemory * 95 / 100 ))
LAB_GPUS=4  # fake GPUs the node offers: jobs that ask --gres gpu:N are allocated and accounted N GPUs
NODE_HOSTNAME=""  # a node not named after this host (another lab's) says which host it is
[ "$NODE" = "$(hostname -s)" ] || NODE_HOSTNAME=" NodeHostname=$(hostname -s)"

cat >"$LAB/etc/slurm.conf.new" <<CONF
ClusterName=$CLUSTER
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=$PORT_BASE
SlurmdPort=$((PORT_BASE + 1))
StateSaveLocation=$LAB/state
SlurmdSpoolDir=$LAB/spool
SlurmctldPidFile=$LAB/run/slurmctld.pid
SlurmdPidFile=$LAB/run/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldTimeout=30
# a slurmd this loaded 2-core node leaves unanswered for 30 s is not marked down (its jobs go on meanwhile)
SlurmdTimeout=120
InactiveLimit=0
KillWait=5
MinJobAge=300
MessageTimeout=10
# a batch job slurmd is slow to start on this busy 2-core node is waited for, not requeued as a node failure
BatchStartTimeout=120
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$((PORT_BASE + 2))
JobCompType=jobcomp/filetxt
JobCompLoc=$LOGS/jobcomp.txt
# Fake GPUs (gres.conf below): jobs asking --gres gpu:N run, and sacct's AllocTRES shows gres/gpu=N
GresTypes=gpu
AccountingStorageTRES=gres/gpu
NodeName=${NODE}${NODE_HOSTNAME} NodeAddr=127.0.0.1 Gres=gpu:${LAB_GPUS} CPUs=${CPUs} Boards=${Boards} SocketsPerBoard=${SocketsPerBoard} CoresPerSocket=${CoresPerSocket} ThreadsPerCore=${ThreadsPerCore} RealMemory=${MEM} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
# slurmd drops GPUs without device files, so each fake GPU is a file: a symlink to /dev/null
for i in $(seq 0 $((LAB_GPUS - 1))); do ln -sfn /dev/null "$LAB/dev/gpu$i"; done
cat >"$LAB/etc/gres.conf.new" <<CONF
AutoDetect=off
NodeName=${NODE} Name=gpu File=$LAB/dev/gpu[0-$((LAB_GPUS - 1))]
CONF
# slurmdbd.conf must sit next to slurm.conf and be mode 600, or slurmdbd refuses it.
cat >"$LAB/etc/slurmdbd.conf.new" <<CONF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$((PORT_BASE + 2))
SlurmUser=root
DebugLevel=info
LogFile=$LOGS/slurmdbd.log
PidFile=$LAB/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$((PORT_BASE + 3))
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
CONF
for f in slurm.conf gres.conf slurmdbd.conf; do
  if ! cmp -s "$LAB/etc/$f.new" "$LAB/etc/$f"; then
    alive slurmctld && echo "slurm-up: WARNING: $f changed while daemons run; run slurm-down.sh first" >&2
    mv "$LAB/etc/$f.new" "$LAB/etc/$f"
  else
    rm -f "$LAB/etc/$f.new"
  fi
done
chmod 600 "$LAB/etc/slurmdbd.conf"
echo "export SLURM_CONF=$SLURM_CONF" >"$LAB/env.sh"

# --- munge: reuse a running munged (it may serve someone else too); otherwise start one and remember it is ours
if ! munge -n </dev/null >/dev/null 2>&1; then
  if [ ! -s /etc/munge/munge.key ]; then  # Debian's postinst normally creates it
    mungekey --create --force 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
    chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
  rm -f /run/munge/munged.pid
  runuser -u munge -- /usr/sbin/munged </dev/null >>"$LOGS/munged.stdout" 2>&1 9>&-   # daemonizes itself
  poll 10 - test -s /run/munge/munged.pid || die "munged wrote no pid file" /var/log/munge/munged.log "$LOGS/munged.stdout"
  cp /run/munge/munged.pid "$PIDS/munged"
  poll 10 munged sh -c 'munge -n </dev/null | unmunge' || die "munge does not work" /var/log/munge/munged.log
fi

# --- MariaDB in its own datadir, TCP on 127.0.0.1 only
if ! alive mariadbd; then
  port_free $((PORT_BASE + 3)) mariadbd
  if [ ! -d "$LAB/mysql/data/mysql" ]; then
    rm -rf "$LAB/mysql/data"
    mariadb-install-db --no-defaults --datadir="$LAB/mysql/data" --user=root --auth-root-authentication-method=normal \
      --skip-test-db >"$LOGS/mariadb-install.log" 2>&1 || die "mariadb-install-db failed" "$LOGS/mariadb-install.log"
  fi
  # the innodb settings silence slurmdbd's warnings about them
  start mariadbd /usr/sbin/mariadbd --no-defaults --datadir="$LAB/mysql/data" --user=root \
    --bind-address=127.0.0.1 --port=$((PORT_BASE + 3)) --socket="$LAB/mysql/mysqld.sock" \
    --pid-file="$LAB/run/mariadbd.pid" --log-error="$LOGS/mariadb.err" \
    --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900
fi
# also when MariaDB was already running: an earlier run may have died before this step (a slow machine)
poll 180 mariadbd mariadb-admin --socket="$LAB/mysql/mysqld.sock" -uroot ping \
  || die "MariaDB did not come up within 180 s" "$LOGS/mariadb.err" "$LOGS/mariadbd.stdout"
mariadb --socket="$LAB/mysql/mysqld.sock" -uroot -e "
  CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw';
  CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmpw';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
  FLUSH PRIVILEGES;"

# --- slurmdbd, then register the cluster (before slurmctld first connects)
if ! alive slurmdbd; then
  port_free $((PORT_BASE + 2)) slurmdbd
  start slurmdbd /usr/sbin/slurmdbd -D
fi
# It answers within a second or two, but once on this 2-core machine, started beside a suite's three workers, it
# answered only ~5 min after it logged "started" (nothing else in its log): wait that long, then say what sacctmgr says.
poll 360 slurmdbd sacctmgr -n list cluster \
  || die "slurmdbd did not answer within 360 s; sacctmgr says: $(timeout 30 sacctmgr -n list cluster 2>&1 | tail -n 3)" \
    "$LOGS/slurmdbd.log" "$LOGS/slurmdbd.stdout"
sacctmgr -n -P list cluster format=Cluster | grep -qx "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null

# --- slurmctld + slurmd
start_slurmctld
if ! alive slurmd; then
  port_free $((PORT_BASE + 1)) slurmd
  if [ "$NODE" = "$(hostname -s)" ]; then start slurmd /usr/sbin/slurmd -D; else start slurmd /usr/sbin/slurmd -D -N "$NODE"; fi
fi
# a node a start before the fake GPUs drained for them (its state outlives restarts) is usable now
if sinfo -h -n "$NODE" -o '%E' 2>/dev/null | grep -q 'gres/gpu count reported lower'; then
  poll 30 - node_has_gpus && scontrol update NodeName="$NODE" State=RESUME
fi
wait_node_ready
# plain sacct answers once slurmctld has registered with slurmdbd
poll 30 - sacct -n -X || die "sacct does not work" "$LOGS/slurmdbd.log" "$LOGS/slurmctld.log"
echo "slurm-up: cluster $CLUSTER up in $(elapsed)s (SLURM_CONF=$SLURM_CONF; source $LAB/env.sh)"
