#!/usr/bin/env bash
# Stop what tests/sshd/start.sh DIR started: the sshd, and the sessions it serves (ssh's shared
# connections would otherwise stay open for their ControlPersist time).
dir=$1
[ -f "$dir/sshd.pid" ] || exit 0
pid=$(cat "$dir/sshd.pid")
# The session processes are children of the listening sshd.
for child in $(pgrep -P "$pid"); do kill "$child" 2>/dev/null; done
kill "$pid" 2>/dev/null
rm -f "$dir/sshd.pid"
