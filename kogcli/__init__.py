"""The `kog` command line."""
