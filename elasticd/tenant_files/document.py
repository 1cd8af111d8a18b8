"""A tenant's file from a request's body (pure): the body is the tenant's mapping, as it would stand under
``tenants.<tenant>`` in a config file, as JSON or as YAML (``Content-Type: application/yaml``). The file written is
``tenants: {<tenant>: <mapping>}`` in block style, so that the loader's fast (libyaml) path reads it, with a header
that says who wrote it. Whether the mapping is a valid tenant is the loader's to say, against the whole
configuration (runtime.py): here only its shape.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import Any

from ruamel.yaml import YAML

from elasticd.config.load import NAME_RE

__all__ = ["MAX_BODY", "BodyError", "parse_body", "tenant_file_name", "tenant_text"]

# A tenant's mapping is a few hundred bytes; a thousand apps of one tenant is about 200 KB.
MAX_BODY = 1 << 20

_YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")


class BodyError(ValueError):
    """The body cannot be a tenant's mapping: what is wrong, for a 400."""


def check_name(tenant: str) -> None:
    if not NAME_RE.match(tenant):
        raise BodyError(f'"{tenant}" is not a valid tenant name (lowercase letters, digits, "_" and "-", starting with '
                        "a letter or digit, at most 63 characters)")


def parse_body(raw: bytes, content_type: str) -> dict[str, Any]:
    """The tenant's mapping from JSON (the default) or YAML."""
    if len(raw) > MAX_BODY:
        raise BodyError(f"the body is {len(raw)} bytes, over the {MAX_BODY} a tenant's configuration may be")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(f"the body is not UTF-8 (byte {exc.start})") from None
    kind = content_type.split(";")[0].strip().lower()
    if kind in _YAML_TYPES:
        try:
            body = YAML(typ="safe", pure=True).load(io.StringIO(text))
        except Exception as exc:
            raise BodyError(f"the body is not valid YAML: {exc}") from None
    else:
        try:
            body = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BodyError(f"the body is not valid JSON: {exc} (YAML needs Content-Type: application/yaml)") from None
    if not isinstance(body, dict):
        what = "null" if body is None else type(body).__name__
        raise BodyError(f"the body must be the tenant's mapping (its user, resources, quotas, apps), not {what}")
    if "tenants" in body and len(body) == 1:
        raise BodyError("the body is the tenant's own mapping, not a whole file: leave out tenants: and the name")
    return body


def tenant_file_name(tenant: str) -> str:
    return f"{tenant}.yaml"


def tenant_text(tenant: str, raw: bytes, body: Mapping[str, Any], written_by: str) -> tuple[str, int | None]:
    """The file, and how many lines stand before the body in it: a header, then ``tenants: {tenant: ...}`` with the
    body as it was sent, indented (its comments kept, and the loader's errors then name the body's own lines:
    subtract the offset), or, when it does not read back as the same mapping so placed, dumped in block style
    (offset None)."""
    header = (f"# The configuration of tenant {tenant}, written by elasticd ({written_by}).\n"
              "# It is read through the main file's include:; change it with elasticctl tenant set, or by hand and\n"
              "# then elasticctl reload.\n")
    opening = f"tenants:\n  {tenant}:\n"
    lines = raw.decode("utf-8").splitlines()
    if lines and "\t" not in raw.decode("utf-8") and not any(line.startswith(("%", "---", "...")) for line in lines):
        text = header + opening + "".join(f"    {line}\n" if line.strip() else "\n" for line in lines)
        try:
            again = YAML(typ="safe", pure=True).load(io.StringIO(text))
        except Exception:
            again = None
        if isinstance(again, dict) and again.get("tenants", {}).get(tenant) == body:
            return text, header.count("\n") + opening.count("\n")
    out = io.StringIO()
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.dump({"tenants": {tenant: dict(body)}}, out)
    return header + out.getvalue(), None
