# proto/: wire contracts (tqkv.proto → protobuf-c at build time; ring ABI header).
