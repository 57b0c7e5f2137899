"""The local checkpoint tier (issue 35): node-local saves, peer replicas, restore and drain.

See /docs and ckptflow.core.tier for the layout; peers.py for the replicas' side channel.
"""
