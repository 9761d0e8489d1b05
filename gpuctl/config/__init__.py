"""cluster.yml: the model, its rules, loading with located errors, and derived views."""

from gpuctl.config.loader import load_cluster, load_cluster_bytes, load_cluster_text
from gpuctl.config.model import Cluster

__all__ = ["Cluster", "load_cluster", "load_cluster_bytes", "load_cluster_text"]
