"""Cluster plumbing: process groups, placement groups, local multi-node clusters (Ray at the edges)."""
