"""Managing clients: their rate limits, concurrency, weight, tier and highest priority.

Changes take effect on the next submit and the next dispatch decision: no restart."""

from __future__ import annotations

from typing import TypedDict, Unpack

from dtask import services
from dtask.domain.clients import DEFAULT_CLIENT, Client, Rate, Tier, check_name
from dtask.exceptions import ClientNotFound


class ClientSettings(TypedDict, total=False):
    """What ``set_client`` may change; a setting left out keeps its value, None removes a limit."""

    rate: Rate | str | None  # runs per period: "50/m"
    child_rate: Rate | str | None  # children per period: "100000/h"
    max_running: int | None
    weight: float
    tier: Tier | str | None
    max_priority: int


def set_client(name: str, **settings: Unpack[ClientSettings]) -> Client:
    """Create the client ``name`` or change the settings given; return it."""
    store = services.store().clients
    try:
        current = store.get(check_name(name))
    except ClientNotFound:
        current = Client(name)
    updated = current.changed(**settings)
    store.save(updated)
    return get_client(name)


def get_client(name: str) -> Client:
    """The client with what it uses now (``usage``); ClientNotFound if it was never set."""
    return services.store().clients.get(check_name(name))


def list_clients() -> list[Client]:
    return services.store().clients.list()


def remove_client(name: str) -> None:
    """Forget the client's settings; its runs stay, new submits as it are refused."""
    services.store().clients.remove(check_name(name))


def webhook_secret(name: str, rotate: bool = False) -> str:
    """The secret the client's completion notifications are signed with (made on first use;
    ``rotate`` replaces it)."""
    if check_name(name) != DEFAULT_CLIENT:
        get_client(name)
    notify = services.store().notify
    return notify.rotate(name) if rotate else notify.secret(name)
