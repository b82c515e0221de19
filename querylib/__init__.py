"""The library every tq process uses: record-batch codec, partition log storage, RPC, the broker,
the pub/sub API and the `tq` command."""
