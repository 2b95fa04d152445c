"""Where each actor of a run goes: the bundles of its Ray placement groups and the slot of
every component in them.

Invariants (checked by :func:`plan`, which refuses a config that breaks them, naming it):

- the trainer's side has ``max(trainer.gpus, trainer.world_size)`` bundles of one GPU each
  (bundles 0 .. side-1), in a group of their own laid on one node (``STRICT_PACK``: a one-process
  trainer's hybrid replicas map its GPU memory) — or on as few nodes as hold it (``PACK``) for a
  trainer of several ranks, which may span nodes; trainer rank ``r`` takes its fraction of bundle
  ``r`` (``Placement.ranks``), bundle 0 also holds ``trainer.resources``;
- hybrid replicas live in the trainer's bundles, round robin — each with its fraction of
  that GPU, and the fractions on one GPU (the trainer's included) fit in it; a hybrid replica
  of ``rollout.tensor_parallel_size`` T spans T consecutive trainer-side GPUs (``trainer.gpus``
  a multiple of T: ``trainer.gpus / T`` such spans, round robin), with its fraction of each;
- every standalone replica has a bundle of its own (``rollout.tensor_parallel_size`` GPUs —
  one unless tensor-parallel, its actor taking them all — and ``rollout.resources``), so it
  never lands on a trainer GPU nor shares a GPU with another standalone replica — unless
  ``rollout.share_trainer_gpu`` (one-GPU machines) puts them in the trainer's bundle too; those
  bundles form a second group laid over the nodes by ``rollout.placement_strategy``;
- a config that asks for no GPU gets no plan (plain CPU reservations, as on CPU machines).

The plan is plain data; ``actors/launch/placement.py`` reserves it and turns slots into Ray options.
"""

from __future__ import annotations

import msgspec

from shunter.engine.config.base import ConfigError
from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.config.rollout import RolloutConfig

TRAINER_BUNDLE = 0


class Slot(msgspec.Struct, frozen=True):
    bundle: int
    """The (first) bundle it is placed in."""
    num_gpus: float
    num_cpus: float
    gpus: int = 1
    """GPUs its engine runs on (``rollout.tensor_parallel_size`` for a replica): a hybrid
    replica spans bundles ``bundle .. bundle + gpus - 1``, a standalone one holds a bundle of
    this many GPUs."""


class Placement(msgspec.Struct, frozen=True):
    bundles: list[dict[str, float]]
    """Every bundle, the trainer's side first (``trainer_bundles`` of them), then the replicas'."""
    trainer: Slot
    hybrid: list[Slot]
    standalone: list[Slot]
    trainer_bundles: int = 1
    strategy: str = "SPREAD"
    ranks: list[Slot] = []
    """Trainer rank r's slot, by rank (``trainer``, rank 0's, first); empty: one rank, ``trainer``."""
    trainer_strategy: str = "STRICT_PACK"
    """How the replicas' group lays its bundles over the nodes."""

    @property
    def gpus(self) -> int:
        return int(sum(b.get("GPU", 0) for b in self.bundles))

    def groups(self) -> list[tuple[list[dict[str, float]], str]]:
        """The placement groups to reserve: (bundles, strategy) — the trainer's side, then the
        standalone replicas' (none when they share the trainer's GPU)."""
        side = self.bundles[: self.trainer_bundles]
        rest = self.bundles[self.trainer_bundles :]
        return [(side, self.trainer_strategy)] + ([(rest, self.strategy)] if rest else [])

    def locate(self, bundle: int) -> tuple[int, int]:
        """A global bundle index as (group, index within the group)."""
        return (0, bundle) if bundle < self.trainer_bundles else (1, bundle - self.trainer_bundles)


def replica_gpus(rollout: RolloutConfig, standalone: bool) -> float:
    """Ray GPUs one replica's actor takes: ``rollout.num_gpus``, or for a standalone replica of
    ``rollout.tensor_parallel_size`` T > 1 on GPUs, T whole GPUs (vLLM's workers use them all)."""
    tp = rollout.tensor_parallel_size
    return float(tp) if standalone and tp > 1 and rollout.num_gpus > 0 else rollout.num_gpus


def plan(cfg: EngineConfig) -> Placement | None:
    t, r = cfg.trainer, cfg.rollout
    if t.num_gpus == 0 and r.num_gpus == 0:
        return None
    if t.num_gpus == 0:
        raise ConfigError(
            "rollout.num_gpus > 0 but trainer.num_gpus = 0: give the trainer a GPU (a fraction of one "
            "when hybrid replicas share it)"
        )
    if r.num_gpus == 0:
        raise ConfigError("trainer.num_gpus > 0 but rollout.num_gpus = 0: give each replica a GPU or a fraction")
    tp = r.tensor_parallel_size
    if r.num_gpus > 1:
        raise ConfigError(
            f"rollout.num_gpus = {r.num_gpus:g}: a replica takes at most one GPU per rank — a replica over "
            "several GPUs is rollout.tensor_parallel_size (each standalone one then reserves that many)"
        )
    side = max(t.gpus, t.world_size)
    if tp > 1 and r.hybrid_replicas and side % tp:
        raise ConfigError(
            f"the trainer side's GPUs (max(trainer.gpus, trainer.world_size) = {side}) are not a multiple of "
            f"rollout.tensor_parallel_size ({tp}): each hybrid replica spans {tp} of the trainer's GPUs"
        )
    if tp > 1 and r.share_trainer_gpu and r.standalone_replicas:
        raise ConfigError(
            f"rollout.share_trainer_gpu with rollout.tensor_parallel_size = {tp}: standalone replicas that share "
            "the trainer's GPU are one-GPU replicas — turn it off (each gets its own GPUs) or make them hybrid"
        )
    spans = side // tp  # the trainer side's spans of tp GPUs a hybrid replica takes
    guests = [0] * side  # replicas per trainer-side GPU
    hybrid = []
    for k in range(r.hybrid_replicas):
        first = (k % spans) * tp
        hybrid.append(Slot(first, r.num_gpus, r.num_cpus, gpus=tp))
        for g in range(first, first + tp):
            guests[g] += 1
    standalone = []
    if r.share_trainer_gpu:
        standalone = [Slot(0, r.num_gpus, r.num_cpus) for _ in range(r.standalone_replicas)]
        guests[0] += r.standalone_replicas
    what = "hybrid" + (" and standalone" if r.share_trainer_gpu else "")
    for g, n in enumerate(guests):
        used = (t.num_gpus if g < t.world_size else 0) + n * r.num_gpus
        if n and used > 1 + 1e-9:
            head = f"trainer.num_gpus ({t.num_gpus:g}) + " if g < t.world_size else ""
            raise ConfigError(
                f"trainer-side GPU {g}: {head}{n} {what} replicas x rollout.num_gpus ({r.num_gpus:g}) "
                f"= {used:g} GPUs, more than one — lower the fractions (or raise trainer.gpus)"
            )
    bundles = [
        {"GPU": 1.0, "CPU": (t.num_cpus if g < t.world_size else 0) + n * r.num_cpus} for g, n in enumerate(guests)
    ]
    for name, v in t.resources.items():
        bundles[0][name] = bundles[0].get(name, 0.0) + v
    if r.share_trainer_gpu:
        for name, v in r.resources.items():
            bundles[0][name] = bundles[0].get(name, 0.0) + v * r.standalone_replicas
    trainer = Slot(TRAINER_BUNDLE, t.num_gpus, t.num_cpus)
    if not r.share_trainer_gpu:
        for _ in range(r.standalone_replicas):  # a tensor-parallel replica's actor takes its whole bundle
            standalone.append(Slot(len(bundles), float(tp) if tp > 1 else r.num_gpus, r.num_cpus, gpus=tp))
            bundles.append({"GPU": float(tp), "CPU": r.num_cpus, **r.resources})
    for b in bundles:  # Ray refuses zero-valued resources in a bundle
        for name in [name for name, v in b.items() if v == 0]:
            del b[name]
    return Placement(
        bundles=bundles,
        trainer=trainer,
        hybrid=hybrid,
        standalone=standalone,
        trainer_bundles=side,
        strategy=r.placement_strategy,
        ranks=[Slot(g, t.num_gpus, t.num_cpus) for g in range(t.world_size)] if t.world_size > 1 else [],
        trainer_strategy="STRICT_PACK" if t.world_size == 1 else "PACK",
    )
