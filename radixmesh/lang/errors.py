"""Errors of the language layer."""

from __future__ import annotations

from radixmesh.errors import RadixMeshError


class ProgramError(RadixMeshError):
    """A program failed; the cause is chained. Raised when its state is read."""


class BackendUnavailable(RadixMeshError):
    """The chosen backend cannot be used in this build (it names what provides it)."""
