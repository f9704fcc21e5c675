"""Render the schema as the configuration reference (docs/configuration.md).

    python -m streamrl.configs.reference > docs/configuration.md

A test keeps the committed file equal to this output, so the schema stays the
one place a knob is documented.
"""

from __future__ import annotations

from pydantic import BaseModel

from streamrl.configs.schema import Config


def _default(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    else:
        value = field.default
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if isinstance(value, list):
        value = [v.model_dump() if isinstance(v, BaseModel) else v for v in value]
    return f"`{value!r}`"


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from the schema (`configs/`, and each engine's and transport's own options) by `python -m streamrl.configs.reference`; do not edit by hand.",
        "Set keys in a YAML preset (`configs/*.yaml`) or on the command line as `section.key=value`.",
        "`REDIS_URL` in the environment overrides `broker.redis_url`.",
        "",
    ]
    for section_name, section_field in Config.model_fields.items():
        section = section_field.annotation
        lines += [f"## `{section_name}`", "", (section.__doc__ or "").strip().splitlines()[0], ""]
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        lines += _rows(section_name, section)
        lines.append("")
    return "\n".join(line for line in lines) + "\n"


def _rows(prefix: str, section: type[BaseModel]) -> list[str]:
    """One table row per knob; a nested section (``model.lora``) gives a row per knob of its own."""
    rows = []
    for name, field in section.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            # a section of its own (``model.lora``, an engine's or transport's options): a row
            # saying what it is and when it is read, then a row per knob
            said = (field.description or "").replace("|", "\\|")
            rows.append(f"| `{prefix}.{name}` | section | | {said} |")
            rows += _rows(f"{prefix}.{name}", field.annotation)
            continue
        kind = getattr(field.annotation, "__name__", None) or str(field.annotation).replace(
            "typing.", ""
        )
        desc = (field.description or "").replace("|", "\\|")
        rows.append(
            f"| `{prefix}.{name}` | {kind.replace('|', '/')} | {_default(field)} | {desc} |"
        )
    return rows


if __name__ == "__main__":
    print(render(), end="")
