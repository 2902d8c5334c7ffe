"""`infersight loadtest`: stepped open-loop load against a server, with its bottleneck at the knee."""
