"""The mount: its views and tree, mmfs.json, the fusepy adapter and the daemon's lifecycle."""
