#!/bin/bash
# The simulated node's main process (virtual/README.md), as an Atlas node boots: sshd for Ansible, and the node's
# own Docker daemon, its data root on the node's volume (/var/lib/docker), for the training container.
#   1. host keys on first start (the image's would be one key for every node);
#   2. cgroups writable: a container sees its cgroup hierarchies read-only, and dockerd makes one cgroup per
#      container. cgroup v1: each hierarchy is mounted again read-write (the node's containers go under
#      /rollout8-sim/<node>); v2: the namespace's root is remounted read-write and this script's processes move
#      to a child, since v2 puts no process in a cgroup that has children;
#   3. the network as an Atlas node's: the interface without the default route (the data network, sim_nodes.py)
#      named ROLLOUT8_SIM_DATA_NIC, as a real node's data NIC has a fixed name (Docker numbers its interfaces in
#      no fixed order across restarts); with ROLLOUT8_SIM_HOSTNAME_LOOPBACK=1, the hostname resolves to 127.0.1.1
#      as Debian's and Ubuntu's installers write /etc/hosts (rewritten in place: Docker bind-mounts the file);
#   4. the shared directory as an NFS export with root_squash (virtual/rootsquash.py: the raw export at
#      /srv/rollout8-export, served at /mnt/rollout8-shared), before dockerd, which bind-mounts it into the
#      training container; bounded wait for the mount;
#   5. dockerd in the background (log: /var/log/dockerd.log). No bridge and no iptables rules: the training
#      container uses the node's network (network_mode: host), as on a real node. /run outlives a restart of the
#      node's container (a machine's is a tmpfs): the last boot's pid files go first, or dockerd refuses to start
#      when their pid is taken by another process of this boot;
#   6. the firewall (/etc/nftables.conf, the README's rule that sim_nodes.firewall wrote), as nftables.service
#      loads it at boot: a restarted node's network namespace is a new one, without rules;
#   7. the site's unkind traits (sim_nodes.py names the node of each): ROLLOUT8_SIM_LOGIN_UID=N gives the login
#      user (ROLLOUT8_SIM_LOGIN_USER) uid and gid N, where a site's nodes were set up one by one; with
#      ROLLOUT8_SIM_NO_DEFAULT_ROUTE=1 the node has no default route, as air-gapped nodes often have none (the
#      management network stays reachable on its own subnet: the bastion is there); with ROLLOUT8_SIM_HOMES=DIR
#      the login user's home is on a root-squashed share (/srv/rollout8-homes served at DIR), as on sites whose
#      homes are NFS: root (sudo) cannot read what the login user keeps there;
#   8. sshd in the foreground.
set -u
ls /etc/ssh/ssh_host_*_key >/dev/null 2>&1 || ssh-keygen -A
mkdir -p /run/sshd
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  mount -o remount,rw /sys/fs/cgroup
  mkdir -p /sys/fs/cgroup/init
  xargs -rn1 </sys/fs/cgroup/cgroup.procs >/sys/fs/cgroup/init/cgroup.procs 2>/dev/null || true
  sed -e 's/ / +/g' -e 's/^/+/' </sys/fs/cgroup/cgroup.controllers >/sys/fs/cgroup/cgroup.subtree_control || true
else
  awk '$3 == "cgroup" {print $2, $4}' /proc/self/mounts | while read -r dir opts; do
    controllers=$(echo "$opts" | tr ',' '\n' | grep -v -x -E 'ro|rw|nosuid|nodev|noexec|relatime' | paste -sd,)
    case $controllers in name=*) controllers=none,$controllers ;; esac
    umount "$dir" && mount -t cgroup -o "$controllers" cgroup "$dir" || echo "node-init: $dir stays read-only" >&2
  done
fi
if [ -n "${ROLLOUT8_SIM_DATA_NIC:-}" ]; then
  default_if=$(ip -o route show default | awk '{print $5; exit}')
  for nic in $(ls /sys/class/net); do
    case $nic in lo|"$default_if"|"$ROLLOUT8_SIM_DATA_NIC") ;;
      *) ip link set dev "$nic" down && ip link set dev "$nic" name "$ROLLOUT8_SIM_DATA_NIC" &&
           ip link set dev "$ROLLOUT8_SIM_DATA_NIC" up || echo "node-init: $nic not renamed" >&2 ;;
    esac
  done
fi
if [ "${ROLLOUT8_SIM_HOSTNAME_LOOPBACK:-}" = 1 ]; then
  { echo "127.0.1.1 $(hostname)"; grep -v "[[:space:]]$(hostname)\$" /etc/hosts; } >/tmp/hosts.node-init &&
    cat /tmp/hosts.node-init >/etc/hosts
fi
if [ -d /srv/rollout8-export ]; then
  mkdir -p /mnt/rollout8-shared
  /usr/local/sbin/rollout8-rootsquash /srv/rollout8-export /mnt/rollout8-shared >/var/log/rootsquash.log 2>&1 &
  for _ in $(seq 50); do mountpoint -q /mnt/rollout8-shared && break; sleep 0.2; done
  mountpoint -q /mnt/rollout8-shared || echo "node-init: /mnt/rollout8-shared is not mounted (/var/log/rootsquash.log)" >&2
fi
rm -f /run/docker.pid /run/docker/containerd/containerd.pid
dockerd --data-root /var/lib/docker --bridge none --iptables=false --cgroup-parent "/rollout8-sim/$(hostname)" \
  >/var/log/dockerd.log 2>&1 &
if grep -q "^table" /etc/nftables.conf 2>/dev/null; then
  nft -f /etc/nftables.conf || echo "node-init: /etc/nftables.conf did not load" >&2
fi
if [ -n "${ROLLOUT8_SIM_LOGIN_UID:-}" ] && [ "$(id -u "$ROLLOUT8_SIM_LOGIN_USER")" != "$ROLLOUT8_SIM_LOGIN_UID" ]; then
  groupmod -g "$ROLLOUT8_SIM_LOGIN_UID" "$ROLLOUT8_SIM_LOGIN_USER" &&
    usermod -u "$ROLLOUT8_SIM_LOGIN_UID" -g "$ROLLOUT8_SIM_LOGIN_UID" "$ROLLOUT8_SIM_LOGIN_USER" ||
    echo "node-init: $ROLLOUT8_SIM_LOGIN_USER keeps its uid" >&2
fi
if [ -d /srv/rollout8-homes ] && [ -n "${ROLLOUT8_SIM_HOMES:-}" ] && [ -n "${ROLLOUT8_SIM_LOGIN_USER:-}" ]; then
  install -d -m 0755 -o "$ROLLOUT8_SIM_LOGIN_USER" -g "$ROLLOUT8_SIM_LOGIN_USER" \
    "/srv/rollout8-homes/$ROLLOUT8_SIM_LOGIN_USER"
  mkdir -p "$ROLLOUT8_SIM_HOMES"
  /usr/local/sbin/rollout8-rootsquash /srv/rollout8-homes "$ROLLOUT8_SIM_HOMES" >/var/log/rootsquash-homes.log 2>&1 &
  for _ in $(seq 50); do mountpoint -q "$ROLLOUT8_SIM_HOMES" && break; sleep 0.2; done
  if mountpoint -q "$ROLLOUT8_SIM_HOMES"; then
    usermod -d "$ROLLOUT8_SIM_HOMES/$ROLLOUT8_SIM_LOGIN_USER" "$ROLLOUT8_SIM_LOGIN_USER"
  else
    echo "node-init: $ROLLOUT8_SIM_HOMES is not mounted (/var/log/rootsquash-homes.log)" >&2
  fi
fi
if [ "${ROLLOUT8_SIM_NO_DEFAULT_ROUTE:-}" = 1 ]; then
  ip route del default 2>/dev/null || true
fi
exec /usr/sbin/sshd -D -e
