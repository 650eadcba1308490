#!/usr/bin/env bash
# PID 1 of one simulated node (tests/realengine/nodes.py starts it under
# `unshare --net --mount --pid --uts --fork`): the node's own root filesystem, sshd and dockerd.
#
# The root is an overlay of this machine's `/` with a tmpfs on top, so the node has every tool the
# host has, and whatever it writes (docker's bind-mount sources it creates, /etc/sysctl.d, the
# driver paths, stateDir) stays on the node and disappears with it. /var/lib/docker is a real
# directory on the host's disk (overlay2 cannot stack on an overlay). The node's devices are fake
# char devices (1:3, /dev/null's) under the names of the NPU driver's; /proc/meminfo and
# vm.nr_hugepages are files the node owns, so huge pages are given and taken back per node.
#
# Killing this process (PID 1 of the node's PID namespace) kills everything the node started,
# the containers' processes included; its mounts go with its mount namespace.
#
# Parameters (environment): NODE_DIR (a host directory owned by this node), NODE_NAME, NODE_NPUS,
# NODE_REGISTRY (host:port of the loopback registry), NODE_PUBKEY (authorized key for root),
# NODE_FAKES (directory with fake npu-smi and hccn_tool), NODE_MEM_KIB (fake MemTotal).
set -euo pipefail
: "${NODE_DIR:?}" "${NODE_NAME:?}" "${NODE_NPUS:?}" "${NODE_REGISTRY:?}" "${NODE_PUBKEY:?}" "${NODE_FAKES:?}"
mem_kib=${NODE_MEM_KIB:-16777216}

hostname "$NODE_NAME"
mount --make-rprivate /
ip link set lo up

t=$NODE_DIR/t       # the node's RAM: overlay upper, /tmp, /home, /root
r=$t/root
mkdir -p "$t"
mount -t tmpfs -o mode=755 "apd-$NODE_NAME" "$t"
mkdir -p "$t/upper" "$t/work" "$r"
mount -t overlay overlay -o "lowerdir=/,upperdir=$t/upper,workdir=$t/work" "$r"

mount -t proc proc "$r/proc"
mount --rbind /sys "$r/sys"
mount -t tmpfs -o mode=755 run "$r/run"
mkdir -p "$NODE_DIR/docker"
mount --bind "$NODE_DIR/docker" "$r/var/lib/docker" 2>/dev/null || {
  mkdir -p "$r/var/lib/docker"; mount --bind "$NODE_DIR/docker" "$r/var/lib/docker"; }
for d in tmp home mnt root; do mount -t tmpfs -o mode=755 "$d" "$r/$d"; done
chmod 1777 "$r/tmp"
mkdir -p "$r/data"

# /dev: the usual nodes, then the NPU driver's (fakes that behave like /dev/null).
dev=$r/dev
mount -t tmpfs -o mode=755 dev "$dev"
mk() { mknod -m "$1" "$dev/$2" c "$3" "$4"; }
mk 666 null 1 3; mk 666 zero 1 5; mk 666 full 1 7; mk 666 random 1 8; mk 666 urandom 1 9; mk 666 tty 5 0
mkdir -p "$dev/pts" "$dev/shm" "$dev/mqueue"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$dev/pts"
ln -s pts/ptmx "$dev/ptmx"
mount -t tmpfs -o mode=1777 shm "$dev/shm"
mount -t mqueue mqueue "$dev/mqueue" 2>/dev/null || true
ln -s /proc/self/fd "$dev/fd"; ln -s /proc/self/fd/0 "$dev/stdin"; ln -s /proc/self/fd/1 "$dev/stdout"
ln -s /proc/self/fd/2 "$dev/stderr"
for i in $(seq 0 $((NODE_NPUS - 1))); do mk 666 "davinci$i" 1 3; done
for n in davinci_manager devmm_svm hisi_hdc; do mk 666 "$n" 1 3; done

# Huge pages the node owns: the script writes vm.nr_hugepages and reads /proc/meminfo.
fake=$t/fake
mkdir -p "$fake"
echo 0 > "$fake/nr_hugepages"
cat > "$fake/meminfo" <<EOF
MemTotal:       $mem_kib kB
MemFree:        $mem_kib kB
MemAvailable:   $mem_kib kB
HugePages_Total:   1048576
HugePages_Free:    1048576
HugePages_Rsvd:        0
HugePages_Surp:        0
Hugepagesize:       2048 kB
EOF
mount --bind "$fake/meminfo" "$r/proc/meminfo"
mount --bind "$fake/nr_hugepages" "$r/proc/sys/vm/nr_hugepages"

# The Ascend driver paths the NPU container mounts, and the tools a node has.
mkdir -p "$r/usr/local/Ascend/driver/lib64" "$r/usr/local/dcmi" "$r/usr/local/sbin" "$r/opt/apd-node"
echo "Driver_Install_Path_Param=/usr/local/Ascend" > "$r/etc/ascend_install.info"
: > "$r/etc/hccn.conf"
echo "Version=25.2.3" > "$r/usr/local/Ascend/driver/version.info"
cp "$NODE_FAKES/npu-smi" "$NODE_FAKES/hccn_tool" "$NODE_FAKES/_scenario.sh" "$r/usr/local/bin/"
echo "$NODE_NAME" > "$r/etc/hostname"

# This machine's capability bounding set lacks CAP_SYS_RESOURCE, so runc cannot give a privileged
# container the full set; the wrapper drops what the host cannot grant, then runs runc. Test
# harness only: a real node's runc grants everything.
cat > "$r/opt/apd-node/runc" <<'EOF'
#!/usr/bin/env bash
set -euo pipefail
drop() {
  local f=$1 filter=$2 tmp
  [ -f "$f" ] || return 0
  tmp=$(mktemp "$f.XXXXXX")
  jq "$filter" "$f" > "$tmp" && mv "$tmp" "$f"
}
caps='map_values(if type == "array" then map(select(. != "CAP_SYS_RESOURCE")) else . end)'
prev=
for a in "$@"; do
  case "$prev" in
    --bundle|-b) drop "$a/config.json" "if .process.capabilities then .process.capabilities |= $caps else . end" ;;
    --process|-p) drop "$a" "if .capabilities then .capabilities |= $caps else . end" ;;
  esac
  case "$a" in --bundle=*) drop "${a#--bundle=}/config.json" "if .process.capabilities then .process.capabilities |= $caps else . end" ;; esac
  prev=$a
done
exec /usr/sbin/runc "$@"
EOF
chmod 755 "$r/opt/apd-node/runc"

# sshd: throw-away host key, root by key only, the session's PATH as a node's.
s=$r/opt/apd-node/ssh
mkdir -p "$s" "$r/root/.ssh" "$r/run/sshd"
ssh-keygen -q -t ed25519 -N '' -f "$s/host_ed25519" -C "$NODE_NAME"
cp "$NODE_PUBKEY" "$r/root/.ssh/authorized_keys"
chmod 700 "$r/root/.ssh"; chmod 600 "$r/root/.ssh/authorized_keys"
cat > "$s/sshd_config" <<EOF
Port 22
HostKey /opt/apd-node/ssh/host_ed25519
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile /run/sshd.pid
MaxStartups 200:30:400
MaxSessions 200
AcceptEnv LANG LC_*
SetEnv PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
EOF

# pivot_root, not chroot: runc falls back to chroot for containers when its own root is a chroot,
# and a `docker exec` then joins a mount namespace whose root is the node's, not the container's.
cd "$r"
mkdir -p .oldroot
pivot_root . .oldroot
umount -l /.oldroot
rmdir /.oldroot
cd /
exec /bin/bash -c '
set -euo pipefail
/usr/sbin/sshd -D -f /opt/apd-node/ssh/sshd_config -E /opt/apd-node/sshd.log &
/usr/sbin/dockerd --data-root /var/lib/docker --exec-root /run/docker --pidfile /run/docker.pid \
  -H unix:///run/docker.sock --bridge=none --iptables=false --ip-masq=false --ip6tables=false \
  --userland-proxy=false --storage-driver overlay2 --insecure-registry "$0" \
  --add-runtime apd-runc=/opt/apd-node/runc --default-runtime apd-runc \
  --exec-opt native.cgroupdriver=cgroupfs --cgroup-parent "apd-$1" > /opt/apd-node/dockerd.log 2>&1 &
echo ready > /run/apd-node-started
# PID 1 of the namespace: reap every orphan until killed.
while :; do wait; sleep 1; done
' "$NODE_REGISTRY" "$NODE_NAME"
