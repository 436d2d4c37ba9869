# client/: libtqkv, tqctl, tqkv-run.
