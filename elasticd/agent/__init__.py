"""HAProxy's agent-check, answered: the line (``line``: pure, what a host or an app's room becomes) and the TCP
listener on ``server.agent_listen`` (``listener``)."""
