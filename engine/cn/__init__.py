"""Compute nodes (issue 15, decision 0007): a CN starts empty, pulls logtail from the TN for
the timestamp of each read, applies it to its own copy of the state, reads blocks from the
object store itself, and sends its transactions to the TN.

Modules: `port` (what a CN needs of a TN: the `TNPort` protocol and its answers), `node` (the
compute node), `client` (the port over the network: engine/tn's wire protocol).
"""
