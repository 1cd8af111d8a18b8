"""Re-executing elasticd in place (issue 32): the state one image hands the next (``state``) and which of its
workers the next adopts (``adoption``). Pure so far; the re-exec itself is the daemon's (to come)."""
