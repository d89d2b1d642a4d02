"""What a ``strategies`` server tells a user's ClientApp beyond the project's own wire
(``fedinit/methods/wire.py``): which method runs, with which parameters, and what the
client's upload must go through before it leaves (the privacy mode's device noise).

The project's ClientApp reads the method from the run config both apps share. A user's app
has its own run config, so the server names the method and its parameters in every train
message, and the client half (``strategies.client``) builds the method's client rule from
them: the two halves cannot disagree about FedDyn's alpha. Pure: no Flower, no torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from fedinit.methods.dp import DEVICE_NOISE, Mechanism
from fedinit.methods.method import ClientRule, Params
from fedinit.methods.registry import METHOD_NAMES, METHODS

METHOD = "method"
"""Train-config key: the registry name of the method the server runs
(``fedinit.methods.registry``)."""
INITIAL = "w-initial"
"""ArrayRecord of a train message: the run's w_0, sent (under RI) to a client whose
accounted round is 0, so its client half starts RI from the server's own w_0 without a copy
of it (a client that already holds a w_prev ignores it)."""


RELEASE = {"mode": "dp", "clip": "dp-clip", "clip_extra": "dp-clip-extra",
           "noise_multiplier": "dp-noise-multiplier", "noise_shares": "dp-noise-shares"}
"""Train-config keys of the release a client makes (``Mechanism``'s fields by these names):
under ``privacy=DistributedDP(...)`` each client clips its uploads and adds its share of the
noise, z x bound / sqrt(t_min), before SecAgg+ masks them."""
CLIENT_RELEASES = ("off", "central", "distributed", "local")
"""The privacy modes ``strategies.client`` serves: nothing to add (``off``; ``central``,
where the server clips and noises), its noise share (``distributed``) or, under the device's
floor and into its ledger, its whole noise (``local``: ``strategies.device_privacy``)."""


def release_config(mechanism: Mechanism) -> dict[str, Any]:
    """The train-config entries of the run's release (its privacy mode and bounds)."""
    return {key: getattr(mechanism, name) for name, key in RELEASE.items()}


def asked_release(config: Mapping[str, Any]) -> Mechanism:
    """The release a train message names, whatever its mode (a message without the keys,
    from a server that names none: ``off``); ValueError (one line) for a mode the client
    half does not serve."""
    mode = str(config.get(RELEASE["mode"], "off"))
    if mode not in CLIENT_RELEASES:
        raise ValueError(f"the train message asks for privacy mode dp={mode!r}; "
                         f"strategies.client serves {' | '.join(CLIENT_RELEASES)}")
    if mode == "off" and RELEASE["clip"] not in config:
        return Mechanism(mode="off", clip=math.inf, clip_extra=math.inf, noise_multiplier=0.0,
                         expected_clients=1)
    values = {name: config[key] for name, key in RELEASE.items()}
    # the noise is split into shares only inside a secure sum: under ``local`` each device
    # adds all of it, whatever a message says (its ledger counts z, never z / sqrt(shares))
    shares = int(values["noise_shares"]) if mode == "distributed" else 1
    return Mechanism(mode=mode, clip=float(values["clip"]),
                     clip_extra=float(values["clip_extra"]),
                     noise_multiplier=float(values["noise_multiplier"]),
                     expected_clients=1, noise_shares=shares)


def release_of(config: Mapping[str, Any]) -> Mechanism | None:
    """The release a train message asks its client to apply (None: nothing to clip or
    noise on the client, ``off`` or ``central``); ValueError as ``asked_release``."""
    asked = asked_release(config)
    return asked if asked.mode in DEVICE_NOISE else None


def method_config(method: str, params: Params) -> dict[str, Any]:
    """The train-config entries naming ``method`` and its parameters (run-config keys)."""
    values = {f.name.replace("_", "-"): getattr(params, f.name)
              for f in dataclasses.fields(params)}
    return {METHOD: method, **values}


def client_rule(config: Mapping[str, Any]) -> tuple[str, ClientRule[Any]]:
    """(method name, its client rule) from a train message's config; ValueError (one line)
    when the message names no method, an unknown one, or a parameter the method refuses."""
    name = config.get(METHOD)
    if name is None:
        raise ValueError(f"the train message's config has no {METHOD!r}: the server is not "
                         "running a strategies.* strategy (use one, or train without "
                         "strategies.client)")
    if name not in METHODS:
        raise ValueError(f"the server names method={name!r}; this client knows "
                         f"{' | '.join(METHOD_NAMES)}")
    spec = METHODS[str(name)]
    keys = spec.params.config_keys()
    missing = [k for k in keys if k not in config]
    if missing:
        raise ValueError(f"the train message names method={name!r} without its parameter "
                         f"{missing[0]!r}")
    return spec.name, spec.client(spec.params.from_config({k: config[k] for k in keys}))
