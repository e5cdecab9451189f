#!/usr/bin/env bash
# A private sshd on 127.0.0.1 for the remote-workstation tests (tests/remote.rs, scripts/e2e.sh). Run as root.
#   tests/sshd/start.sh DIR GANTRY_BIN SYSTEM_SOCKET USER...
# Makes in DIR: a host key, a key pair per USER (DIR/keys/USER), their authorized keys (outside their
# homes: DIR/authorized/USER), and DIR/ssh_config with a Host `USER-ws` per user (that user, that key,
# the pinned host key). Each user's session finds `gantry` (a link to GANTRY_BIN) on its PATH and the
# test's system engine at SYSTEM_SOCKET. Prints the port; stop with `tests/sshd/stop.sh DIR`.
set -euo pipefail
dir=$1 bin=$2 socket=$3; shift 3
[ -x /usr/sbin/sshd ] || { echo "sshd missing: apt-get install openssh-server" >&2; exit 1; }
mkdir -p "$dir/bin" "$dir/keys" "$dir/authorized" /run/sshd
chmod 755 "$dir" "$dir/bin" "$dir/authorized"
ln -sf "$bin" "$dir/bin/gantry"
ssh-keygen -q -t ed25519 -N '' -C host -f "$dir/host_key" </dev/null
: >"$dir/ssh_config"
for u in "$@"; do
  # useradd leaves the password field `!`, which sshd (without PAM) reads as a locked account.
  [ "$(getent shadow "$u" | cut -d: -f2 | cut -c1)" = '!' ] && usermod -p '*' "$u"
  rm -f "$dir/keys/$u" "$dir/keys/$u.pub"
  ssh-keygen -q -t ed25519 -N '' -C "$u" -f "$dir/keys/$u" </dev/null
  printf 'environment="PATH=%s/bin:/usr/bin:/bin",environment="GANTRY_SYSTEM_SOCKET=%s" %s\n' "$dir" "$socket" "$(cat "$dir/keys/$u.pub")" >"$dir/authorized/$u"
  chmod 644 "$dir/authorized/$u"
done
for port in $(shuf -i 20000-60000 -n 20); do
  cat >"$dir/sshd_config" <<CFG
ListenAddress 127.0.0.1
Port $port
HostKey $dir/host_key
PidFile $dir/sshd.pid
AuthorizedKeysFile $dir/authorized/%u
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitUserEnvironment yes
AllowUsers $*
LogLevel VERBOSE
CFG
  # sshd binds before it detaches: a taken port fails here, and we try the next.
  if /usr/sbin/sshd -f "$dir/sshd_config" -E "$dir/sshd.log"; then
    echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$dir/host_key.pub")" >"$dir/known_hosts"
    for u in "$@"; do
      cat >>"$dir/ssh_config" <<CFG
Host $u-ws
  HostName 127.0.0.1
  Port $port
  User $u
  IdentityFile $dir/keys/$u
  IdentitiesOnly yes
  UserKnownHostsFile $dir/known_hosts
  StrictHostKeyChecking yes
CFG
    done
    echo "$port"
    exit 0
  fi
done
echo "sshd did not start: see $dir/sshd.log" >&2
exit 1
