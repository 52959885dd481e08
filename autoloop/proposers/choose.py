"""Choosing the proposer of a night (``make_proposer``), from the settings.

``--proposer auto`` (the default) picks, in this order:

1. the portfolio, when ``portfolio`` lists its members;
2. the coding agent, when one is configured (``agent`` or ``agent_cmd``);
3. the queue, when patches are waiting in ``queue_dir``;
4. the offline mutator (hyperparameter search over the target's constants).

An explicit ``--proposer agent|queue|mutate|optuna|portfolio`` gets exactly that one.
Whatever is chosen is checked now, so a missing agent executable, a missing Optuna or a
target without constants is one line at start-up, not a failure in every trial.
"""

from __future__ import annotations

from pathlib import Path

from autoloop.config.settings import Settings
from autoloop.proposers.base import Proposer, ProposerError


def make_proposer(settings: Settings, workspace_root: Path) -> tuple[Proposer, str]:
    """The proposer the settings ask for, and one line saying which was chosen and why."""
    from autoloop.observe.console import plural
    from autoloop.proposers.queue import QueueProposer

    root = Path(workspace_root)
    queue_dir = root / settings.queue_dir
    agent_configured = bool(settings.agent or settings.agent_cmd)
    choice = settings.proposer
    if choice == "portfolio" or (choice == "auto" and settings.portfolio):
        return _portfolio(settings, root, auto=choice == "auto")
    if choice == "optuna":
        return _optuna(settings, root)
    if choice == "queue":
        return QueueProposer(queue_dir), f"proposer: queue of patches in {settings.queue_dir}/"
    if choice == "combine":
        return _combine()
    if choice == "agent" or (choice == "auto" and agent_configured):
        if not agent_configured:
            raise ProposerError("--proposer agent needs an agent: pass --agent PRESET "
                                "(claude, codex, aider, gemini) or --agent-cmd CMD")
        return _agent(settings, root, auto=choice == "auto")
    if choice == "auto":
        queue = QueueProposer(queue_dir)
        waiting = len(queue.pending())
        if waiting:
            return queue, (f"proposer: queue ({plural(waiting, 'patch', 'patches')} waiting in {settings.queue_dir}/; "
                           f"no agent configured)")
        proposer, why = _mutate(settings, root)
        return proposer, f"{why} (auto: no agent configured, no patches in {settings.queue_dir}/)"
    if choice == "mutate":
        return _mutate(settings, root)
    raise ProposerError(f"proposer '{choice}' is not available in this version")


def _agent(settings: Settings, root: Path, auto: bool) -> tuple[Proposer, str]:
    from autoloop.core.durations import format_duration
    from autoloop.proposers.agent import make_agent_proposer

    proposer, command = make_agent_proposer(settings, root)   # AgentSetupError is a ProposerError
    source = "--agent-cmd" if proposer.label == "--agent-cmd" else f"preset {proposer.label}"
    ignored = " (--agent-cmd given: preset ignored)" if settings.agent and settings.agent_cmd else ""
    why = " (auto: an agent is configured)" if auto else ""
    return proposer, (f"proposer: agent, {source}: {command} [timeout "
                      f"{format_duration(settings.agent_timeout)}]{ignored}{why}")


def _combine() -> tuple[Proposer, str]:
    from autoloop.proposers.combine import CombineProposer

    return CombineProposer(), ("proposer: combine, the night's near-misses (lost within the noise) tried two at a "
                               "time on the best")


def _mutate(settings: Settings, root: Path) -> tuple[Proposer, str]:
    from autoloop.proposers.mutate import MutateError, MutateProposer, constant_moves, find_constants

    target = root / settings.target
    try:
        constants = find_constants(target.read_bytes())
    except FileNotFoundError:
        raise ProposerError(f"mutate: {settings.target} not found") from None
    except IsADirectoryError:
        raise ProposerError(f"mutate: {settings.target} is a folder, not a file") from None
    except MutateError as e:
        raise ProposerError(f"mutate: {settings.target}: {e}") from None
    tunable = [c.name for c in constants if constant_moves(c)]
    if not tunable:
        raise ProposerError(f"mutate: {settings.target} has no UPPER_CASE constants to tune; "
                            f"configure an agent (--agent, --agent-cmd) or queue patches")
    return MutateProposer(), f"proposer: mutate ({len(tunable)} constants of {settings.target} to tune)"


def _optuna(settings: Settings, root: Path) -> tuple[Proposer, str]:
    from autoloop.proposers.mutate import MutateError
    from autoloop.proposers.optuna_search import STUDY_FILE, OptunaProposer, check_installed
    from autoloop.proposers.space import build_space

    check_installed(settings.sampler)   # OptunaSetupError is a ProposerError
    try:
        space = build_space((root / settings.target).read_bytes())
    except FileNotFoundError:
        raise ProposerError(f"optuna: {settings.target} not found") from None
    except MutateError as e:
        raise ProposerError(f"optuna: {settings.target}: {e}") from None
    if not space:
        raise ProposerError(f"optuna: {settings.target} has no UPPER_CASE constants to search; "
                            f"configure an agent (--agent, --agent-cmd) or queue patches")
    return OptunaProposer(settings.sampler), (f"proposer: optuna, sampler {settings.sampler} "
                                              f"({len(space.dimensions)} values of {settings.target}; "
                                              f"study in results/{STUDY_FILE})")


def _portfolio(settings: Settings, root: Path, auto: bool) -> tuple[Proposer, str]:
    from autoloop.proposers.portfolio import PortfolioProposer
    from autoloop.proposers.queue import QueueProposer

    names = settings.portfolio or default_portfolio(settings)
    members: dict[str, Proposer] = {}
    shown: list[str] = []
    for name in names:
        if name == "agent":
            if not (settings.agent or settings.agent_cmd):
                raise ProposerError("--portfolio includes agent: pass --agent PRESET (claude, codex, aider, gemini) "
                                    "or --agent-cmd CMD")
            member, why = _agent(settings, root, auto=False)
        elif name == "optuna":
            member, why = _optuna(settings, root)
        elif name == "mutate":
            member, why = _mutate(settings, root)
        elif name == "combine":
            member, why = _combine()
        else:
            member = QueueProposer(root / settings.queue_dir)
            why = f"proposer: queue of patches in {settings.queue_dir}/"
        members[name] = member
        shown.append(why.removeprefix("proposer: "))
    why = " (auto: --portfolio given)" if auto else ""
    return PortfolioProposer(members, min_trial_s=settings.budget), (
        f"proposer: portfolio of {', '.join(names)}, a Thompson-sampling bandit on the best's gain per hour "
        f"picking who proposes each trial{why}; " + "; ".join(shown))


def default_portfolio(settings: Settings) -> list[str]:
    """--proposer portfolio without --portfolio: the agent when one is configured, Optuna, the mutator."""
    return (["agent"] if settings.agent or settings.agent_cmd else []) + ["optuna", "mutate"]
