"""Publish from a Hugging Face ``Trainer`` (and so from TRL's trainers, which are
``Trainer`` subclasses): ``trainer.add_callback(HotloadCallback(publisher, every=N))``.

Every ``every`` optimizer steps (``on_step_end`` runs once per optimizer step, after
gradient accumulation) the callback hands the model's ``state_dict()`` to the
:class:`~hotload.publish.Publisher`, whose ``publish`` returns once the weights are
copied: the training loop goes on while the snapshot is encoded and delivered. With a
sharded model (FSDP2's DTensors) the same callback runs on every rank with a publisher
built with ``distributed=True``: each rank hands over its own shards, and every rank
reaches ``publish`` at the same step, as the publisher needs.

``select`` narrows the state_dict to what replicas serve (e.g. drop tied aliases or a
value head); by default every entry is published. At the end of training the callback
publishes the last step if the cadence skipped it, and waits for every publish to end
(``wait_at_end``), raising the first failure, so a finished run has nothing in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hotload.errors import ConfigError
from hotload.publish.publisher import Publisher, PublishHandle
from hotload.publish.results import PublishResult

log = logging.getLogger(__name__)

Select = Callable[[Mapping[str, Any]], Mapping[str, Any]]


class HotloadCallback(TrainerCallback):
    """Publish the model every ``every`` optimizer steps (see the module docstring)."""

    def __init__(
        self,
        publisher: Publisher,
        *,
        every: int = 1,
        select: Select | None = None,
        wait_at_end: bool = True,
    ) -> None:
        if every < 1:
            raise ConfigError("publish every one optimizer step or more", every=every)
        self.publisher = publisher
        self.every = every
        self.select = select
        self.wait_at_end = wait_at_end
        self.handles: list[PublishHandle] = []
        self._published_step: int | None = None

    def on_step_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        if state.global_step % self.every == 0:
            self._publish(kwargs.get("model"), state.global_step)

    def on_train_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        if state.global_step > 0 and self._published_step != state.global_step:
            self._publish(kwargs.get("model"), state.global_step)
        if self.wait_at_end:
            self.results()

    def results(self, timeout: float | None = None) -> list[PublishResult]:
        """Wait for every publish so far; their results, in order (the first failure
        raised)."""
        return [handle.result(timeout) for handle in self.handles]

    def _publish(self, model: Any, step: int) -> None:
        if model is None:
            raise ConfigError("the trainer passed no model to the callback", step=step)
        weights = model.state_dict()
        if self.select is not None:
            weights = self.select(weights)
        handle = self.publisher.publish(weights, step)
        self.handles.append(handle)
        self._published_step = step
        log.info(
            "snapshot handed to the publisher",
            extra={"step": step, "blocked_s": round(handle.blocked_seconds, 4)},
        )
