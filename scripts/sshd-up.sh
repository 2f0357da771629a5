#!/usr/bin/env bash
# Bring up a private sshd on 127.0.0.1 standing in for a cluster login node (tests of scheduler `ssh:`), as root,
# without systemd: its own host key, config, authorized_keys and client key, all in a state dir. The system sshd
# service is never used or started. Idempotent: returns at once when it is already up and a login works.
#
# Usage: scripts/sshd-up.sh     -> prints the state dir on its last line; then: ssh -F "$dir/ssh_config" evalrun-login
# Env:   SSH_LAB   state dir (default /tmp/evalrun-ssh): sshd_config, host key, id_ed25519(.pub), authorized_keys,
#                  known_hosts ([127.0.0.1]:PORT and [localhost]:PORT), ssh_config (Host evalrun-login), sshd.log,
#                  home/ (the sessions' HOME)
#        SSH_PORT  listen port (default 2222)
# Stop:  scripts/sshd-down.sh [--purge]
set -euo pipefail
LAB=${SSH_LAB:-/tmp/evalrun-ssh}
LAB=${LAB%/}
PORT=${SSH_PORT:-2222}
SSHD=/usr/sbin/sshd
ALIAS=evalrun-login
# sshd's sessions get this PATH (sbatch & co. live in /usr/bin)
REMOTE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# ... and find the lab SLURM cluster (scripts/slurm-up.sh) as a login node finds /etc/slurm/slurm.conf
SLURM_CONF_FOR_SESSIONS=${SLURM_LAB:-/tmp/evalrun-slurm}/etc/slurm.conf
# ... and an empty HOME of the lab's own: bash sources ~/.bashrc for every ssh command, and this machine's root
# dotfiles are not the lab's (a `pyenv init` there waits 60 s on the stale rehash lock a killed shell leaves)
SESSION_HOME=$LAB/home

# Several test sessions on one machine may call this at once: serialise them.
mkdir -p "$(dirname "$LAB")"
exec 9>"$LAB.lock"
flock -w 600 9 || { echo "sshd-up: timed out waiting for $LAB.lock" >&2; exit 1; }

die() {  # die MESSAGE: print it and the tail of sshd's log, exit 1
  echo "sshd-up: ERROR: $1" >&2
  [ -s "$LAB/sshd.log" ] && { echo "----- tail -n 30 $LAB/sshd.log" >&2; tail -n 30 "$LAB/sshd.log" >&2; }
  exit 1
}
# alive: the recorded pid is running and really is sshd (guards against pid reuse); zombies do not count
alive() {
  local pid st; pid=$(cat "$LAB/sshd.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = sshd ] || return 1
  st=$(awk '/^State:/{print $2}' "/proc/$pid/status" 2>/dev/null) && [ -n "$st" ] && [ "$st" != Z ]
}
login_ok() { ssh -F "$LAB/ssh_config" -o ConnectTimeout=5 "$ALIAS" true </dev/null >/dev/null 2>&1; }

# --- package (only if missing). No service may start from the install: we run our own sshd.
if [ ! -x "$SSHD" ]; then
  echo "sshd-up: installing openssh-server"
  export DEBIAN_FRONTEND=noninteractive
  made_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && made_policy=1
    trap 'if [ -n "$made_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi' EXIT
  fi
  apt_install() { apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 openssh-server >/dev/null; }
  apt_install 2>/dev/null || { apt-get update -qq -o DPkg::Lock::Timeout=300 && apt_install; } \
    || die "apt-get install openssh-server failed"
  if [ -n "$made_policy" ]; then rm -f /usr/sbin/policy-rc.d; made_policy=""; fi
  [ -x "$SSHD" ] || die "$SSHD missing after installing openssh-server"
fi

mkdir -p "$LAB" "$SESSION_HOME"
chmod 700 "$LAB"
install -d -m 0755 /run/sshd   # privilege separation dir; systemd-tmpfiles would make it, but there is no systemd
[ -s "$LAB/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -C evalrun-sshd -f "$LAB/ssh_host_ed25519_key"
[ -s "$LAB/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C evalrun-client -f "$LAB/id_ed25519"
# the client files are read by sessions of other test workers while this runs: replaced whole, never truncated
replace() { cat >"$1.new" && mv -f "$1.new" "$1"; }
replace "$LAB/authorized_keys" <"$LAB/id_ed25519.pub"
hostkey=$(cut -d' ' -f1,2 "$LAB/ssh_host_ed25519_key.pub")
printf '[127.0.0.1]:%s %s\n[localhost]:%s %s\n' "$PORT" "$hostkey" "$PORT" "$hostkey" | replace "$LAB/known_hosts"

# StrictModes no: the state dir lives under /tmp (mode 1777), which sshd's ownership checks would refuse.
cat >"$LAB/sshd_config.new" <<CONF
ListenAddress 127.0.0.1
Port $PORT
HostKey $LAB/ssh_host_ed25519_key
PidFile none
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthenticationMethods publickey
AuthorizedKeysFile $LAB/authorized_keys
StrictModes no
UsePAM no
X11Forwarding no
PrintMotd no
PermitUserEnvironment no
AcceptEnv none
SetEnv PATH=$REMOTE_PATH SLURM_CONF=$SLURM_CONF_FOR_SESSIONS HOME=$SESSION_HOME
Subsystem sftp internal-sftp
MaxSessions 50
MaxStartups 50:30:100
LogLevel INFO
CONF
replace "$LAB/ssh_config" <<CONF
Host $ALIAS
  HostName 127.0.0.1
  Port $PORT
  User root
  IdentityFile $LAB/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $LAB/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
CONF
err=$("$SSHD" -t -f "$LAB/sshd_config.new" 2>&1) || die "sshd rejects the generated config: $err"
if ! cmp -s "$LAB/sshd_config.new" "$LAB/sshd_config"; then
  mv "$LAB/sshd_config.new" "$LAB/sshd_config"
  if alive; then  # running with an old config: restart it
    kill "$(cat "$LAB/sshd.pid")" 2>/dev/null || true
    for _ in $(seq 100); do alive || break; sleep 0.1; done
  fi
else
  rm -f "$LAB/sshd_config.new"
fi

# --- sshd: foreground (-D) in its own session, logging to a file (-E), tracked by our own pid file
if ! alive; then
  # in a non-interactive shell a background child is not a process-group leader, so setsid execs in place
  setsid "$SSHD" -D -f "$LAB/sshd_config" -E "$LAB/sshd.log" </dev/null >/dev/null 2>&1 9>&- &
  echo $! >"$LAB/sshd.pid"
fi
end=$(( $(date +%s) + 10 ))
until login_ok; do
  alive || die "sshd exited (port $PORT taken?)"
  [ "$(date +%s)" -lt "$end" ] || die "no ssh login to 127.0.0.1:$PORT within 10 s"
  sleep 0.1
done
echo "sshd-up: listening on 127.0.0.1:$PORT (ssh -F $LAB/ssh_config $ALIAS)"
echo "$LAB"
