"""Async scheduling: a step planned on a token not known yet, and blocks committed only once
every token in them is known.

Under async scheduling the worker computes step N+1 on the token it samples in step N, so the
scheduler plans step N+1 before that token comes back: the request carries a placeholder
(`Request.num_placeholders`) until it does. Two rules keep the ledger true meanwhile:

- plan ahead only where the worker certainly produces the token: a step past `max_tokens` or
  the context would be planned for a request that has already ended;
- hash and declare a block (commit it) only when every token in it is known: a block that a
  placeholder fills has no hash yet. It is committed by a later plan, once its token is back;
  the worker has written it by then, since it runs plans in order.

In lockstep there are no placeholders and both rules reduce to the plain ones.
"""

from __future__ import annotations

from scheduler_svc.core.request import Request


def may_plan_ahead(request: Request, max_len: int) -> bool:
    """A step on a token not known yet only where the worker certainly produces it: never past
    max_tokens or the context (`max_len`), which would end the request first. (An EOS or stop
    token may still end it: that step's token is then discarded.)"""
    ahead = request.num_placeholders
    if ahead == 0:
        return True
    return (
        request.num_output_tokens + ahead < request.max_tokens
        and request.num_tokens + ahead < max_len
    )


def newly_committable(request: Request, total: int, block_size: int) -> int:
    """With `total` tokens computed, moves the request's committed mark to the known ones and
    returns how many known tokens to commit full blocks up to: 0 when no block became both
    full and known since the last commit."""
    known = min(total, request.num_tokens)
    committed = request.num_committed_tokens
    request.num_committed_tokens = max(committed, known)
    if known // block_size <= committed // block_size:
        return 0
    return known
