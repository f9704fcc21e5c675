"""Moving new weights from the learner to the actors (``weightsync``).

What every transport shares is declared here; each transport's own settings are its ``options``
class in its own module (``weightsync.transports.<name>``), which becomes the section
``weightsync.<name>`` of the registry's every transport. So a transport is one module plus its
entry in the registry, and nothing here names one.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, create_model, model_validator

from streamrl.configs.section import Section, backend_sections, unread_options_kept
from streamrl.weightsync.transports import TRANSPORTS


class _Shared(Section):
    """Moving new weights from the learner to the actors."""

    transport: Literal[tuple(TRANSPORTS)] = Field(  # type: ignore[valid-type]
        "shm",
        description="How weights travel: "
        + "; ".join(f"{name} = {t.summary}" for name, t in TRANSPORTS.items())
        + ". Its own settings are the section of its name below.",
    )
    staging_buffers: int = Field(
        2,
        ge=1,
        le=4,
        description="Host buffers the learner copies each version into before the publisher's background thread writes it out, for a transport that writes in the background (shm); pinned when the learner is on a GPU. The learner waits only when the next one is still being written out; each costs one copy of the weights in the transfer dtype.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Dtype weights travel in; converted once on the publisher side (auto = engine dtype).",
    )
    timeout_s: float = Field(
        30.0,
        gt=0,
        description="Upper bound of every blocking transfer call; a slow or dead peer is dropped after it.",
    )

    @property
    def options(self) -> Section | None:
        """The chosen transport's own settings (``weightsync.<transport>``), or None."""
        return getattr(self, self.transport, None)

    @model_validator(mode="after")
    def _unread_options_at_defaults(self) -> _Shared:
        unread_options_kept(
            self, "weightsync", [name for name in TRANSPORTS if name != self.transport],
            f"weightsync.transport={self.transport} does not read it",
        )  # fmt: skip
        return self


WeightSyncConfig = create_model(
    "WeightSyncConfig",
    __base__=_Shared,
    __doc__=_Shared.__doc__,
    __module__=__name__,
    **backend_sections(
        {name: t.options for name, t in TRANSPORTS.items()},
        "The {name} transport's own settings, read while weightsync.transport is {name}.",
    ),
)
