"""The mount: its views and tree, mmfs.json, the FUSE adapter and the daemon's lifecycle."""
