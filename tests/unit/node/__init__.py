"""Tests of the node's own pieces (logsvc/node) that need no running process."""
