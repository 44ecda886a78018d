"""The TN daemon (issue 15, decision 0007): one engine whose WAL is a logsvc shard, served to
compute nodes (CNs) over TCP, with a standby that takes over when the active TN is gone.

    python -m engine serve --config tn.toml [--standby]
    python -m engine promote --config tn.toml

Modules, by the noun each holds:

* `limits`: every bound of the protocol, the server, the client and the standby's watch;
* `errors`: the error codes of the protocol and the exceptions they become on each side;
* `messages`: requests and responses, and their msgpack codec (FORMAT.md beside it), over
  logsvc's frame layer (`logsvc.wire.frames`);
* `service`: what a TN does for a request (status, logtail, commit, subscribe, checkpoints,
  promote) over an `Engine`, with its role; no sockets;
* `pushes`: a subscriber's bounded queue of entries (pure);
* `watch`: the standby's failure detector (pure: probe outcomes in, "promote" out);
* `server`: the asyncio TCP server (token auth, pipelining, pushes, bad input);
* `channel`: one authenticated client connection to a TN (used by engine/cn/client.py's
  `NetworkTN`, by the standby's probes and by `engine promote`);
* `config`: tn.toml and cn.toml;
* `daemon`: `engine serve` and `engine promote`;
* `reader`: `engine cn`, a compute node as a scripted or interactive reader.

The CN side of the network is engine/cn/client.py (`NetworkTN`, the `TNPort` over these
channels, with failover). FORMAT.md beside this file is the protocol.
"""
