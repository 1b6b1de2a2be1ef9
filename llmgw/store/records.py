"""The values the store takes and returns: credentials (API keys, tokens of the admin listener), quota reservations
and rejections, usage records.

All are frozen dataclasses. Times are seconds since the Unix epoch (`time.time()`, UTC), durations are
seconds as float, token counts are ints, costs are floats in the cluster's currency.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

# Reasons an API key is refused, as `KeyCheck.reason` (the gateway's 401 message).
KEY_MALFORMED = "malformed"
KEY_UNKNOWN = "unknown"
KEY_REVOKED = "revoked"
KEY_EXPIRED = "expired"

KEY_FAILURE_MESSAGES = {
    KEY_MALFORMED: "The API key is not a whole llmgw key: llmgw keys are 'sk-llmgw-' and 43 more characters; "
    "check that you copied it whole, or ask your operator for one (`llmgw keys create --project P`).",
    KEY_UNKNOWN: "The API key is not known to this gateway; check that you copied it whole, "
    "or ask your operator for a new one (`llmgw keys create --project P`).",
    KEY_REVOKED: "The API key has been revoked; ask your operator for a new one (`llmgw keys create --project P`).",
    KEY_EXPIRED: "The API key has expired; ask your operator for a new one (`llmgw keys create --project P`).",
}


class CredentialState(StrEnum):
    """Where a credential stands at a moment (`Credential.state`); the value is the word the CLI prints."""

    ACTIVE = "active"
    REVOKED = "revoked"
    EXPIRED = "expired"


@dataclass(frozen=True, kw_only=True)
class Credential:
    """What the store keeps of a secret it issued (an `ApiKey` or a `Token`): never the secret itself, only
    metadata. `name` is the operator's label (None: none); `prefix` the start of the plaintext ("sk-llmgw-AbCd",
    "llmgw-review-AbCd") so people can tell them apart; `created_at`, `expires_at` and `revoked_at` are epoch
    seconds, the last two None when unset (never expires / not revoked).

    Each kind adds its id and the one thing it belongs to: `credential_id` and `group` read them for any kind,
    and `GROUP` names that thing ("project", "scope"): the column and JSON key the CLI prints it under.
    """

    GROUP: ClassVar[str] = ""

    name: str | None
    prefix: str
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None

    @property
    def credential_id(self) -> str:
        """The short printable id ("key_1a2b3c4d", "tok_1a2b3c4d5e6f")."""
        raise NotImplementedError

    @property
    def group(self) -> str:
        """What the credential belongs to: an API key's project, a token's scope."""
        raise NotImplementedError

    def state(self, now: float) -> CredentialState:
        """ACTIVE, REVOKED or EXPIRED at `now` (epoch seconds); a revoked credential is REVOKED even once expired."""
        if self.revoked_at is not None:
            return CredentialState.REVOKED
        if self.expires_at is not None and now >= self.expires_at:
            return CredentialState.EXPIRED
        return CredentialState.ACTIVE


@dataclass(frozen=True)
class ApiKey(Credential):
    """An API key of the gateway as stored: `key_id` ("key_1a2b3c4d") and the `project` it belongs to, besides
    the `Credential` fields (keyword-only). `created_by` and `revoked_by`: the e-mail of the person who made it and
    who revoked it through the admin API (the console, a person's token); None when nobody's token or `llmgw keys`
    did, or before llmgw recorded it."""

    GROUP: ClassVar[str] = "project"

    key_id: str
    project: str
    created_by: str | None = None
    revoked_by: str | None = None

    @property
    def credential_id(self) -> str:
        return self.key_id

    @property
    def group(self) -> str:
        return self.project


# The scopes of a token (`Token.scope`), one word each; a token of scope "admin" passes every check.
#   admin    everything on the admin listener (what `llmgw up` writes to <state>/admin-token)
#   metrics  GET /metrics on the admin listener (Prometheus scrapes with it)
#   review   read-only: GET /api/v1/plan, /api/v1/fleet and /api/v1/status (`llmgw review` in CI)
#   console  the web console's read views
TOKEN_SCOPES: tuple[str, ...] = ("admin", "metrics", "review", "console")
SCOPE_ADMIN = "admin"


@dataclass(frozen=True)
class Token(Credential):
    """A token of the admin listener as stored: `token_id` ("tok_1a2b3c4d5e6f"), its `scope` (one of
    TOKEN_SCOPES) and the person it belongs to (`owner`: an account's e-mail, None: nobody's), besides the
    `Credential` fields (keyword-only)."""

    GROUP: ClassVar[str] = "scope"

    token_id: str
    scope: str
    owner: str | None = None

    @property
    def credential_id(self) -> str:
        return self.token_id

    @property
    def group(self) -> str:
        return self.scope


@dataclass(frozen=True)
class Lease:
    """A lease as the store holds it: its `holder`, its fencing `token` (rises with every new take), and when it
    ends (`expires_at`, unix seconds)."""

    holder: str
    token: int
    expires_at: float


@dataclass(frozen=True)
class SlurmUser:
    """A Linux user llmgw makes on Slurm nodes for a project member (`llmgw.store.slurm_users`): the member's
    `email`, the `login` and `uid` given to it once and kept for good, and when (`created_at`, unix seconds)."""

    email: str
    login: str
    uid: int
    created_at: float


@dataclass(frozen=True)
class Account:
    """A person's local account (`llmgw.store.accounts`): their `email` (lower case: the key, and what projects.yaml
    names), `name` (for commits and pages), when it was made and its password last set (unix seconds), and when it
    was disabled (`disabled_at`, None: active). The password's hash never leaves the store."""

    email: str
    name: str
    created_at: float
    password_changed_at: float
    disabled_at: float | None = None

    @property
    def active(self) -> bool:
        return self.disabled_at is None


@dataclass(frozen=True)
class KeyCheck:
    """The result of checking a presented API key: `key` when accepted, else None and a `reason`.

    `reason` is one of KEY_MALFORMED, KEY_UNKNOWN, KEY_REVOKED, KEY_EXPIRED; `message` is a sentence for
    the 401 body.
    """

    key: ApiKey | None
    reason: str | None = None

    @property
    def message(self) -> str | None:
        return KEY_FAILURE_MESSAGES.get(self.reason) if self.reason else None


@dataclass(frozen=True)
class Allowance:
    """What is left of one limit: for the `x-ratelimit-{limit,remaining,reset}-*` headers.

    `limit` and `remaining` are requests or tokens (never negative); `reset_seconds` is the time until the
    window that holds the usage ends. `scope` and `limit_name` say which limit this is
    ("project:chat", "tokens_per_minute").
    """

    scope: str
    limit_name: str
    limit: int
    remaining: int
    reset_seconds: float


@dataclass(frozen=True)
class LimitUse:
    """One limit of one quota scope and what counts against it now, as the gateway's quota check reads it
    (`llmgw.store.quotas.Snapshot.used`): `scope` ("project:chat", "team:research", "org:acme"), `limit_name` (a
    key of `llmgw.store.quotas.LIMITS`: "requests_per_minute", "budget", ...), the `limit`, what is `used`
    (requests, tokens, the cost in the cluster's currency, or requests in flight) and `reset_seconds`: until what
    counts now is all gone (a fixed window's end; for a per-minute limit, when its newest bucket leaves the sliding
    minute; 1.0 for concurrent requests, which go when they end)."""

    scope: str
    limit_name: str
    limit: float
    used: float
    reset_seconds: float

    @property
    def remaining(self) -> float:
        """What one more request may still use of the limit (never negative)."""
        return max(0.0, self.limit - self.used)


@dataclass(frozen=True)
class Headroom:
    """The tightest request and token allowances over all scopes of a request; None where no limit is set.

    `tokens` is the tightest of tokens_per_minute and tokens_per_day over all scopes.
    """

    requests: Allowance | None = None
    tokens: Allowance | None = None


@dataclass(frozen=True)
class Charge:
    """What a reservation added to one quota window (private to the store; kept for settling)."""

    scope: str
    period: str  # "minute", "day" or "month"
    start: float
    tokens: int
    cost: float


@dataclass(frozen=True)
class Reservation:
    """An admitted request's hold on its quotas, to be settled (or released) exactly once.

    `reservation_id` is None when no scope had any limit: nothing was written and settling costs nothing.
    `headroom` is what remained right after this reservation (for the success headers).
    """

    reservation_id: str | None
    scopes: tuple[str, ...]
    estimated_tokens: int
    estimated_cost: float
    created_at: float
    headroom: Headroom = Headroom()
    charges: tuple[Charge, ...] = ()
    slots: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rejection:
    """A request refused for quota. Nothing was consumed in any scope.

    `scope` and `limit_name` name the limit that refused ("team:research", one of "requests_per_minute",
    "tokens_per_minute", "tokens_per_day", "concurrent_requests", "budget"). `limit` and `remaining` are in
    that limit's unit (requests, tokens, concurrent requests, or currency for the budget), `requested` what
    this request needed of it. `reset_seconds` is when the window ends; `retry_after_seconds` when trying
    again may succeed (for `Retry-After`). `exceeds_limit` is True when the request alone is larger than the
    limit, so retrying cannot help. `headroom` carries both allowances for the 429 headers.
    """

    scope: str
    limit_name: str
    limit: float
    remaining: float
    requested: float
    reset_seconds: float
    retry_after_seconds: float
    exceeds_limit: bool = False
    headroom: Headroom = Headroom()

    @property
    def message(self) -> str:
        """A sentence for the 429 body."""
        what = {
            "requests_per_minute": f"{self.limit:g} requests per minute",
            "tokens_per_minute": f"{self.limit:g} tokens per minute",
            "tokens_per_day": f"{self.limit:g} tokens per day (UTC)",
            "concurrent_requests": f"{self.limit:g} concurrent requests",
            "budget": f"a budget of {self.limit:g} per month",
        }.get(self.limit_name, f"{self.limit_name} {self.limit:g}")
        if self.exceeds_limit:
            return (f"This request needs {self.requested:g} where {self.scope} allows {what}; "
                    "shorten the request or lower max_tokens.")
        return (f"Quota exceeded: {self.scope} allows {what} and {self.remaining:g} remain; "
                f"retry after {self.retry_after_seconds:.0f} s.")


@dataclass(frozen=True)
class UsageRecord:
    """One request as billed. Times: `time` is when the request ended (epoch seconds); `ttft_seconds` the
    time to first token (None for non-streamed or failed requests); `duration_seconds` the whole request.
    `status` is the HTTP status answered. `cost` in the cluster's currency.
    `client_request_id`: the client's own `x-request-id`, as sent (None: it sent none, or one the gateway did not
    accept); `settings_commit`: the settings commit the replica was started from (as its node reports it);
    `trace_id`: the request's W3C trace id, 32 hex digits (the gateway's span, or the client's `traceparent`).
    `batch_id`: the batch of /v1/batches the request was a line of (None: an interactive request).
    """

    project: str
    model: str
    time: float
    key_id: str | None = None
    replica: str | None = None
    node: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    ttft_seconds: float | None = None
    duration_seconds: float = 0.0
    status: int = 200
    cost: float = 0.0
    client_request_id: str | None = None
    settings_commit: str | None = None
    trace_id: str | None = None
    batch_id: str | None = None


@dataclass(frozen=True)
class UsageRow:
    """One group of `query_usage`: `group` is a model name, a project, or a UTC day "YYYY-MM-DD".

    `errors` counts requests whose status was 400 or above. `mean_ttft_seconds` is over the requests that
    have a TTFT (None if none). `cost` in the cluster's currency.
    """

    group: str
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cost: float
    mean_ttft_seconds: float | None
    mean_duration_seconds: float | None


@dataclass(frozen=True)
class PairUsage:
    """The requests of one project to one model (`usage_load`): counts, errors (status 400 or above), token sums."""

    model: str
    project: str
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class UsageLoad:
    """What the usage records since a time say of the load (`usage_load`): `pairs` per (model, project), sorted;
    `busiest_hour` model -> the requests of its busiest clock hour (UTC); `ttfts` model -> the TTFTs (seconds) of
    its latest requests that have one, newest first."""

    pairs: tuple[PairUsage, ...] = ()
    busiest_hour: dict[str, int] = field(default_factory=dict)
    ttfts: dict[str, tuple[float, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Settlement:
    """What an answered request leaves to write: close its reservation and record its usage, in one transaction.

    `entry_id` is the idempotency id (unique, e.g. "stl_" + 32 hex digits): the store writes a settlement with a
    given id at most once, however often it is applied (a spool replays entries after a crash). `reservation_id`
    None: no quota to close. `actual_tokens` None releases the reservation (refunds the estimate); else the
    actual tokens and `actual_cost` replace the estimate. `has_slots` False skips the concurrency-slot delete.
    `time` (epoch seconds) is when the request ended: the windows current then receive the actual usage.
    `charges`: the reservation's charges as (scope, period, start, tokens, cost), when the caller has them (the
    gateway's `Reservation.charges`, see `charged`): a PostgreSQL store then closes the reservation in the same round
    trip as the usage insert; None (and spool entries written before) read them from the reservation row.
    """

    entry_id: str
    time: float
    reservation_id: str | None = None
    has_slots: bool = False
    actual_tokens: int | None = None
    actual_cost: float = 0.0
    usage: UsageRecord | None = None
    charges: tuple[tuple[str, str, float, int, float], ...] | None = None


def charged(reservation: Reservation | None) -> tuple[tuple[str, str, float, int, float], ...] | None:
    """A reservation's charges as `Settlement.charges` holds them (None without a reservation id)."""
    if reservation is None or reservation.reservation_id is None:
        return None
    return tuple((c.scope, c.period, c.start, c.tokens, c.cost) for c in reservation.charges)
