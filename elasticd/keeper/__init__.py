"""The keeper: the parent of every worker, in a unit of its own, so that the workers outlive a crashed elasticd.

Why a process apart, and why it is their parent (issue 42; the anchor is containerd's shim, which holds a container
while dockerd is away): when elasticd's main process dies, systemd restarts elasticd's unit, and with it whatever
the unit holds — its cgroup (on systemd 252 a unit whose subtree holds processes cannot be restarted at all: the new
main process cannot be placed), its private /tmp, its runtime directory. The workers live in the keeper's unit
instead: its cgroup is the base of the tenants' subtree, its namespaces are theirs, and it does not restart with
elasticd. Being their parent, the keeper alone can read their exit statuses (a crash-loop decision needs them,
and an orphan's is lost to whoever adopts it), and holding a read end of each output pipe, it keeps the pipes
whole while elasticd is away (a writer to a pipe with no reader is killed by SIGPIPE).

It is small on purpose: it forks and execs what elasticd asks (``wire``), reaps, tells elasticd each exit, and
keeps a table (``table``) for the next elasticd to read. It decides nothing about workers; elasticd does.
"""
