"""Where a condition is applied alone, every other controller keeping its ``correct`` values: a **site**.

A per-layer figure means a decoder layer: a layer's site intervenes on every controller that sits in it
(``ControlledModel.controller_layers``) together. Where a decoder layer holds more than one controller (a router and
a shared-expert gate, a looped layer's calls ``PATH@callN``), each of them alone is a site too, named by its module
path. In the workbench's families every block holds one controller, so their sites are their layers.
"""

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Site:
    """The controllers (indices) intervened together: all of decoder layer ``layer``'s, or (``alone``) one of
    them, ``controllers[0]``."""

    layer: int
    controllers: tuple[int, ...]
    alone: bool = False

    def name(self, controller_names: Sequence[str]) -> str:
        """How every surface names the site: ``layer L``, or the one controller's module path."""
        return controller_names[self.controllers[0]] if self.alone else f"layer {self.layer}"


def layer_controllers(controller_layers: Sequence[int]) -> dict[int, list[int]]:
    """Per decoder layer that holds any controller, the indices of its controllers; layers in order."""
    grouped: dict[int, list[int]] = {}
    for index, layer in enumerate(controller_layers):
        grouped.setdefault(layer, []).append(index)
    return dict(sorted(grouped.items()))


def layer_sites(controller_layers: Sequence[int]) -> list[Site]:
    """One site per decoder layer that holds a controller, its controllers together; layers in order."""
    return [Site(layer, tuple(group)) for layer, group in layer_controllers(controller_layers).items()]


def controller_sites(controller_layers: Sequence[int]) -> list[Site]:
    """Each controller alone, for the decoder layers that hold more than one (where a layer holds one, its
    controller alone is the layer's site); layers in order."""
    return [
        Site(layer, (index,), alone=True)
        for layer, group in layer_controllers(controller_layers).items()
        if len(group) > 1
        for index in group
    ]


def sites(controller_layers: Sequence[int]) -> list[Site]:
    """Every site the per-layer sweep replays: the layers', then the controllers' alone."""
    return layer_sites(controller_layers) + controller_sites(controller_layers)


Choice = int | str | None  # what a user picks: every controller (None), a decoder layer, or a controller's path


def site_choices(controller_names: Sequence[str], controller_layers: Sequence[int]) -> dict[str, int | str]:
    """What a menu of "intervene at" offers, label → choice: each decoder layer (its controllers together) and,
    where a layer holds more than one, each of them alone (its module path)."""
    layers = {f"layer {site.layer}": site.layer for site in layer_sites(controller_layers)}
    alone = {
        f"{site.name(controller_names)} alone": site.name(controller_names)
        for site in controller_sites(controller_layers)
    }
    return {**layers, **alone}


def chosen_controllers(
    choice: Choice, controller_names: Sequence[str], controller_layers: Sequence[int]
) -> list[int] | None:
    """The controller indices a choice intervenes on (None: every one); a ValueError for one the model lacks."""
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice not in controller_names:
            raise ValueError(f"the model has no controller '{choice}'")
        return [list(controller_names).index(choice)]
    group = layer_controllers(controller_layers).get(choice)
    if group is None:
        held = ", ".join(str(layer) for layer in layer_controllers(controller_layers)) or "none"
        raise ValueError(f"decoder layer {choice} holds no controller (layers with controllers: {held})")
    return group


def choice_name(choice: Choice) -> str:
    """How a view names a choice: ``all layers``, ``layer L``, or the controller's module path."""
    if choice is None:
        return "all layers"
    return choice if isinstance(choice, str) else f"layer {choice}"


def controller_labels(controller_names: Sequence[str], controller_layers: Sequence[int]) -> list[str]:
    """Per controller, how a figure's axis names it: ``layer L`` where it is its layer's only controller, else its
    module path."""
    groups = layer_controllers(controller_layers)
    return [
        f"layer {layer}" if len(groups[layer]) == 1 else name
        for name, layer in zip(controller_names, controller_layers)
    ]
