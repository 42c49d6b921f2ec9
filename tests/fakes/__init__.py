"""Stand-ins for vendor modules this machine does not have, implementing their documented semantics."""
