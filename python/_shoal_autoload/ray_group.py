"""The collective backend "shoal" as registered by ray_hook (only imported once Ray's collective
package has loaded)."""

from __future__ import annotations

from ray.util.collective.collective_group.base_collective_group import BaseGroup

from .ray_hook import lazy_import


class LazyShoalGroup(BaseGroup):
    """Stands for shoal.ray.group.ShoalGroup: making one makes a ShoalGroup."""

    def __new__(cls, *args, **kwargs):
        return lazy_import("shoal.ray.group").ShoalGroup(*args, **kwargs)

    @classmethod
    def backend(cls) -> str:
        return "SHOAL"

    @classmethod
    def check_backend_availability(cls) -> bool:
        return True
