#!/usr/bin/env bash
# One node of a multi-node train stage (infra/k8s/components/multinode). Every pod of the trainer StatefulSet runs
# sshd, so DeepSpeed's launcher can start ranks on it over pdsh; ordinal 0, the first host of the hostfile, also
# runs the GPU worker, which launches them (trainer/training/launch.py: training_command). Runs as the image's
# non-root user: sshd then only admits that user, by key.
set -euo pipefail

SSH_PORT=2222
SSH_SECRET_DIR=/etc/draftsmith/ssh  # the Secret draftsmith-trainer-ssh: id_ed25519, id_ed25519.pub, ssh_host_ed25519_key
PEER_WAIT_SECONDS=600

hostfile="${DRAFTSMITH_WORKER_HOSTFILE:?a trainer node needs DRAFTSMITH_WORKER_HOSTFILE}"
ssh_dir="$HOME/.ssh"
install -d -m 700 "$ssh_dir"
# Copies: a mounted Secret is group-readable, and ssh refuses such keys.
install -m 600 "$SSH_SECRET_DIR/id_ed25519" "$ssh_dir/id_ed25519"
install -m 600 "$SSH_SECRET_DIR/id_ed25519.pub" "$ssh_dir/authorized_keys"
install -m 600 "$SSH_SECRET_DIR/ssh_host_ed25519_key" "$ssh_dir/ssh_host_ed25519_key"

# Every node shares one host key, so the known hosts are known before any node answers: no trust on first use.
mapfile -t hosts < <(awk '!/^[[:space:]]*(#|$)/ {print $1}' "$hostfile")
host_key="$(ssh-keygen -y -f "$ssh_dir/ssh_host_ed25519_key")"
for host in "${hosts[@]}"; do echo "[$host]:$SSH_PORT $host_key"; done > "$ssh_dir/known_hosts"

# The client side, read by pdsh's ssh and by DeepSpeed's own reachability check (`ssh HOST hostname -I`).
cat > "$ssh_dir/config" <<CONFIG
Host *
    Port $SSH_PORT
    IdentityFile $ssh_dir/id_ed25519
    UserKnownHostsFile $ssh_dir/known_hosts
    StrictHostKeyChecking yes
    BatchMode yes
CONFIG
cat > "$ssh_dir/sshd_config" <<CONFIG
Port $SSH_PORT
HostKey $ssh_dir/ssh_host_ed25519_key
PidFile $ssh_dir/sshd.pid
AuthorizedKeysFile $ssh_dir/authorized_keys
AllowUsers $(id -un)
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AllowTcpForwarding no
X11Forwarding no
CONFIG
chmod 600 "$ssh_dir/config" "$ssh_dir/sshd_config"

ordinal="${HOSTNAME##*-}"
if [[ "$ordinal" != "0" ]]; then
    exec /usr/sbin/sshd -D -e -f "$ssh_dir/sshd_config"
fi

/usr/sbin/sshd -e -f "$ssh_dir/sshd_config"  # daemonises; tini (PID 1) reaps what it leaves
# Take jobs only once every node answers: a launch with a node missing would fail the job's train stage.
deadline=$((SECONDS + PEER_WAIT_SECONDS))
for host in "${hosts[@]}"; do
    until ssh "$host" true 2>/dev/null; do
        if (( SECONDS > deadline )); then
            echo "trainer node $host did not answer ssh within ${PEER_WAIT_SECONDS}s" >&2
            exit 1
        fi
        sleep 5
    done
done
echo "all ${#hosts[@]} trainer nodes answer; starting the GPU worker" >&2
exec draftsmith worker --queues gpu
