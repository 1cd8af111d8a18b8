"""Tenants managed by a program (a hosting panel): ``elasticctl tenant add|set|remove|show`` and
``PUT|GET|DELETE /v1/tenants/{tenant}/config``, each tenant in its own file ``<tenant_config_dir>/<tenant>.yaml``.

Pure: document.py (a request's body → the file's text). I/O shell: store.py (the file written whole or not at all,
its backup aside), runtime.py (the daemon's side: validate against the whole configuration, write, apply that
tenant alone, one call at a time).
"""
