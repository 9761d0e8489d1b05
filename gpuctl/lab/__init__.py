"""The lab: a GPU cluster on one machine (systemd-nspawn nodes on a private bridge).

Everything real except the hardware: Debian 12 root filesystems, systemd, SSH with host key
checking, and (through the provisioning roles) munge and Slurm. The NVIDIA and InfiniBand
hardware is simulated, and only inside lab nodes: nothing here runs on a real cluster.
"""
