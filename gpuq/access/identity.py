"""Who is calling: the [[user]] a request's token stands for, or (with `identity = "tailscale"`)
the tailnet login that tailscaled names for the connection's peer. One Caller per request; every
door (the router's API, the pages, the front door) asks here, and nowhere else."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from ..config import Settings, UserConfig
from . import tailnet


@dataclass(frozen=True)
class Caller:
    """A request's sender. `name` is what a job's owner and an event's actor record; None when the
    router knows no one (no token and no users: every caller is the same anonymous one)."""

    name: str | None
    role: str  # "admin" | "member"
    via: str  # how it was known: "token", "tailscale", "serve" (tailscale serve's header), "open"
    user: UserConfig | None = None  # the [[user]] entry, when one matched (its lanes and quotas)

    @property
    def admin(self) -> bool:
        return self.role == "admin"

    def may_act_on(self, owner: str | None) -> bool:
        """An admin acts on every job; a member on their own only."""
        return self.admin or (owner is not None and owner == self.name)

    def actor(self, door: str, remote: str | None) -> str:
        """What an event records as its actor: the user, then the door and the address it came
        from, kept for forensics ('alice (cli 127.0.0.1)'; with no user, 'openai 127.0.0.1')."""
        where = f"{door} {remote or '?'}"
        return where if self.name is None else f"{self.name} ({where})"


# An open router (no token, no users): everyone may do everything, and no one is named.
ANYONE = Caller(name=None, role="admin", via="open")


def locked(settings: Settings) -> bool:
    """Does this router ask who is calling? A token, users, or the tailnet's identity."""
    return bool(settings.users) or settings.token is not None or settings.identity == "tailscale"


def by_token(settings: Settings, token: str | None) -> Caller | None:
    """The caller a bearer token stands for; None when it stands for no one."""
    if token is None:
        return None
    user = settings.user_by_token(token)
    return None if user is None else Caller(user.name, user.role, "token", user)


def by_login(settings: Settings, login: str, via: str) -> Caller | None:
    """A tailnet login as a caller: its [[user]] entry (by name), else the default role; None when
    neither (the router then refuses it, naming the login)."""
    user = settings.user(login)
    if user is not None:
        return Caller(user.name, user.role, via, user)
    if settings.default_role is not None:
        return Caller(login, settings.default_role, via)
    return None


async def who(settings: Settings, tokens: list[str], request: web.Request, any_key: bool = False) -> Caller | None:
    """Who is this request, for both doors (the router's API and the front door): the live
    settings, the tokens it offers (a Bearer token; the front door's x-api-key too) and the
    request itself (its connection, for the tailnet). ANYONE on an open router; None when it stands
    for no one (the door answers 401). A request that offers no token is, with identity =
    "tailscale", who the tailnet says (a wrong token is refused, never passed over)."""
    if not locked(settings):
        return ANYONE
    for token in tokens:
        caller = by_token(settings, token)
        if caller is not None:
            return caller
    # A wrong token is refused, never passed over, unless `any_key`: the front door, whose clients
    # must send some key (the OpenAI SDK will not run without one; Claude Code always sends one),
    # so a key that is no user's token says nothing, and the tailnet says who calls.
    return None if tokens and not any_key else await by_tailnet(settings, request)


async def by_tailnet(settings: Settings, request: web.Request) -> Caller | None:
    """The tailnet's path, for a request that brought no token (gpuq/access/tailnet.py):
    `tailscale serve`'s Tailscale-User-Login where it can be trusted, else tailscaled's whois of
    the peer. None: not asked (identity "token") or no one on the tailnet; a login with no
    [[user]] and no default_role, or a tagged node, is refused: Forbidden, naming it."""
    found = await tailnet.login_of(settings, request)
    if found is None:
        return None
    login, via, told_by = found
    caller = by_login(settings, login, via)
    if caller is None:
        raise tailnet.refuse_login(login, told_by)
    return caller
